"""Where evaluation and sampling run: the model's device, the device a command picks, the cache's name.

Every evaluator builds its inputs on the CPU (padding, collating, class tokens) and sends them to
:func:`model_device` before the model sees them; everything read back goes ``.float().cpu()``
before numpy or a metric, so a model on a GPU and in bfloat16 is evaluated exactly like one on the
CPU in float32. ``mutor eval`` and ``mutor sample`` load their model on :func:`resolve_device`
(the first GPU when there is one; the dtype it loads in: :mod:`mutor.models.loading`).
"""

from __future__ import annotations

import functools
import inspect
import platform
from typing import Optional, Union

import torch

__all__ = ["cache_argument", "cpu_description", "model_device", "resolve_device"]


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


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """The CPU's model name and its instruction-set flags, from ``cpuinfo`` (its first processor); where there is
    none, ``platform.processor()`` (else ``platform.machine()``) and no flags. What a benchmark or an evidence row
    says it ran on."""
    name = platform.processor() or platform.machine()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    return name, frozenset(value.split())
    except OSError:
        pass
    return name, frozenset()


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
