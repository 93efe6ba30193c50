"""The Multi-Token baseline (Gloeckle et al., 2024): extra heads, each a copy of the last layer (``config``,
``model``).

Registered under the name ``multi_token``, with its options in a recipe's ``multi_token:`` block.
"""

from ..registry import Method, register_method
from .config import MT_CONFIG, MultiTokenConfig
from .model import MT_WEIGHTS, MultiTokenModel

__all__ = ["MT_CONFIG", "MT_WEIGHTS", "MultiTokenConfig", "MultiTokenModel"]

register_method(Method("multi_token", MultiTokenModel, "multi_token",
                       "The Multi-Token baseline (Gloeckle et al.): extra heads for x_{t+2}..x_{t+d_max}."))
