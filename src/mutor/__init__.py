"""mutor: multi-token prediction with register tokens (MuToR) for transformers causal LMs."""

from .config import MuToRConfig
from .layout import RegisterLayout, build_layout
from .model import MuToRModel, MuToROutput
from .speculative import DraftStats, generate

__all__ = ["DraftStats", "MuToRConfig", "MuToRModel", "MuToROutput", "RegisterLayout", "build_layout", "generate"]
__version__ = "0.1.0"
