"""mutor: multi-token prediction with register tokens (MuToR) for transformers causal LMs.

The public API. The trainers are imported on first use (``MuToRSFTTrainer`` needs the ``trl`` extra).
"""

from .core.layout import RegisterLayout, build_layout
from .generation.drafter import RegisterDrafter, generate
from .generation.stats import DraftStats
from .methods.multi_token import MultiTokenConfig, MultiTokenModel
from .methods.mutor import MuToRConfig, MuToRModel, MuToROutput
from .methods.next_token import NextTokenConfig, NextTokenModel

__all__ = ["DraftStats", "MuToRConfig", "MuToRModel", "MuToROutput", "MuToRSFTTrainer", "MuToRTrainer",
           "MultiTokenConfig", "MultiTokenModel", "NextTokenConfig", "NextTokenModel", "RegisterDrafter",
           "RegisterLayout", "build_layout", "generate"]
__version__ = "0.1.0"

_LAZY = {"MuToRTrainer": "mutor.integrations.trainer", "MuToRSFTTrainer": "mutor.integrations.trl"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mutor' has no attribute {name!r}")
