"""peft around a transformers model: reaching the model inside, and wrapping one without peft's one warning.

What is unusual: peft reads transformers' deprecated ``is_gradient_checkpointing`` whenever it wraps a model,
which warns on every LoRA run (the attribute goes in transformers v6); :func:`peft_quietly` silences that one
warning, and only it. peft itself is imported only where it is used.
"""

from __future__ import annotations

import contextlib
import warnings

from torch import nn

__all__ = ["inner_model", "peft_quietly"]


def inner_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def peft_quietly():
    """peft's wrapping (``get_peft_model``, ``PeftModel.from_pretrained``) without the deprecation warning it
    triggers by reading ``is_gradient_checkpointing``; every other warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield
