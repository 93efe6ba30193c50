"""Where evaluation and sampling run: the model's device, the device a command picks, the dtype it loads in.

Every evaluator builds its inputs on the CPU (padding, collating, class tokens) and sends them to
:func:`model_device` before the model sees them; everything read back goes ``.float().cpu()``
before numpy or a metric, so a model on a GPU and in bfloat16 is evaluated exactly like one on the
CPU in float32. ``mutor eval`` and ``mutor sample`` load their model on :func:`resolve_device`
(the first GPU when there is one) in :func:`resolve_dtype` (the checkpoint's own by default).
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional, Union

import torch

__all__ = ["DTYPES", "TORCH_DTYPES", "cache_argument", "load_causal_lm", "model_device", "resolve_device",
           "resolve_dtype"]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPES = ("auto", *TORCH_DTYPES)           # "auto": the checkpoint's own


def cache_argument(model: torch.nn.Module) -> str:
    """The name the installed transformers gives a causal LM forward's KV cache: ``cache`` from 5.24 on (where
    ``past_key_values`` is deprecated, to go in 5.40), ``past_key_values`` before. A peft model is asked about
    the model it wraps. Decided once per model class (drafting asks at every step)."""
    while True:
        name = _cache_argument_of(type(model))
        if name is not None or not hasattr(model, "get_base_model"):
            return name or "past_key_values"
        model = model.get_base_model()


@functools.lru_cache(maxsize=None)
def _cache_argument_of(cls: type) -> Optional[str]:
    """``cache`` / ``past_key_values`` when ``cls.forward`` names one of them, else None."""
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else ("past_key_values" if "past_key_values" in params else None)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device a model's inputs must be on: ``model.device`` (transformers, peft and mutor models have
    it; with a ``device_map`` it is where the input embeddings are), else its first parameter's."""
    dev = getattr(model, "device", None)
    if dev is None:
        dev = next(model.parameters()).device
    return torch.device(dev)


def resolve_device(device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """``device`` as given, else ``cuda`` when a GPU is visible, else ``cpu``."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1): {err}") from None


def resolve_dtype(dtype: Optional[str] = "auto") -> Union[str, torch.dtype]:
    """``"auto"`` (the checkpoint's own dtype) or the ``torch.dtype`` named by one of :data:`DTYPES`."""
    if dtype is None or dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    return TORCH_DTYPES[dtype]


def load_causal_lm(path, device: Optional[Union[str, torch.device]] = None, dtype: Optional[str] = "auto"):
    """``AutoModelForCausalLM.from_pretrained(path)`` in ``dtype``, on ``device`` (see above), in eval mode."""
    from transformers import AutoModelForCausalLM

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dt).to(dev).eval()
