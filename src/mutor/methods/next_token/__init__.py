"""The next-token baseline under mutor's mask and loss path (``config``, ``model``).

Registered under the name ``next_token``; it has no recipe block of its own.
"""

from ..registry import Method, register_method
from .config import NT_CONFIG, NextTokenConfig
from .model import NextTokenModel

__all__ = ["NT_CONFIG", "NextTokenConfig", "NextTokenModel"]

register_method(Method("next_token", NextTokenModel, None,
                       "The next-token objective alone: the baseline (the plain model when nothing else is needed)."))
