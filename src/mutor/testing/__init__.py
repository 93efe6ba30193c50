"""Helpers for tests and demos: the byte tokenizer (:mod:`mutor.models.tokenizers`) under a short name; random
models of a named shape live in :mod:`mutor.models.presets`.

The package itself never imports this folder.
"""

from ..models.tokenizers import CHAT_TEMPLATE, SPECIALS, byte_tokenizer

__all__ = ["CHAT_TEMPLATE", "SPECIALS", "byte_tokenizer"]
