"""MuToR, the paper's method: register tokens that predict tokens further ahead (``config``, ``model``).

Registered under the name ``mutor``, with its options in a recipe's ``mutor:`` block.
"""

from ..objective import MuToROutput
from ..registry import Method, register_method
from .config import SIDECAR_CONFIG, MuToRConfig
from .model import SIDECAR_WEIGHTS, MuToRModel

__all__ = ["SIDECAR_CONFIG", "SIDECAR_WEIGHTS", "MuToRConfig", "MuToRModel", "MuToROutput"]

register_method(Method("mutor", MuToRModel, "mutor",
                       "MuToR: (1-a)*L_ntp + a*L_reg with register tokens (the paper)."))
