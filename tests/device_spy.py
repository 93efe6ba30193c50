"""A stand-in accelerator for CPU-only tests: did every input reach ``model.device``?

:func:`on_sentinel` makes a model report ``SENTINEL`` (``cuda:3``) as its ``device`` while its
weights stay on the CPU. Inside :class:`SentinelMode` (a ``TorchFunctionMode``) every tensor sent to
``SENTINEL`` (``.to(SENTINEL)``, ``device=SENTINEL`` in a factory) is really made on the CPU and
comes back as an :class:`OnSentinel` tensor, a plain ``torch.Tensor`` subclass; torch's subclass
propagation keeps the mark on everything computed from it (slices, concatenations, the model's
logits and what is sampled from them). A tensor built on the CPU and never sent is a plain tensor.
A forward pre-hook on the model records the input tensors (``input_ids``, ``attention_mask``,
``position_ids``, ``inputs_embeds``, ``labels``) that arrive without the mark: on a GPU, each of
them would have raised a device-mismatch error.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

SENTINEL = torch.device("cuda", 3)
CHECKED = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "labels")


class OnSentinel(torch.Tensor):
    """A CPU tensor that stands for one on ``SENTINEL``."""


def _is_sentinel(x) -> bool:
    if not isinstance(x, (str, torch.device)):
        return False
    try:
        return torch.device(x) == SENTINEL
    except RuntimeError:
        return False


def _mark(x):
    if isinstance(x, torch.Tensor) and not isinstance(x, OnSentinel):
        return x.as_subclass(OnSentinel)
    if isinstance(x, (tuple, list)):
        return type(x)(_mark(v) for v in x)
    return x


class SentinelMode(TorchFunctionMode):
    """Turn every transfer to ``SENTINEL`` into a CPU tensor marked :class:`OnSentinel`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        sent = False
        if _is_sentinel(kwargs.get("device")):
            kwargs["device"], sent = torch.device("cpu"), True
        if func is torch.Tensor.to:
            args = list(args)
            for i, a in enumerate(args[1:], 1):
                if _is_sentinel(a):
                    args[i], sent = torch.device("cpu"), True
        out = func(*args, **kwargs)
        return _mark(out) if sent else out


class DeviceRecord:
    """What the pre-hook saw: the number of forwards, and every unsent input as ``(call, name)``."""

    def __init__(self):
        self.calls = 0
        self.unsent: list[tuple[int, str]] = []
        self.dtypes: set = set()

    def assert_all_sent(self) -> None:
        assert self.calls > 0, "the model was never called"
        assert not self.unsent, f"inputs never sent to model.device (call, name): {self.unsent[:8]}"


def on_sentinel(model: torch.nn.Module, record: DeviceRecord) -> torch.nn.Module:
    """Make ``model`` report ``SENTINEL`` as its device and record its inputs (in place; returns it)."""
    cls = type(model)
    model.__class__ = type(f"Sentinel{cls.__name__}", (cls,), {"device": property(lambda self: SENTINEL)})

    def check(module, args, kwargs):
        record.calls += 1
        record.dtypes.add(next(module.parameters()).dtype)
        named = dict(zip(("input_ids",), args))
        named.update({k: v for k, v in kwargs.items() if k in CHECKED})
        for name, t in named.items():
            if isinstance(t, torch.Tensor) and not isinstance(t, OnSentinel):
                record.unsent.append((record.calls, name))

    model.register_forward_pre_hook(check, with_kwargs=True)
    return model


@contextlib.contextmanager
def sentinel_module_to(record: DeviceRecord):
    """Within: ``module.to(SENTINEL)`` (what a command does with ``--device cuda:3``) makes the module
    report ``SENTINEL`` and record its inputs, instead of moving anything."""
    real_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if _is_sentinel(target):
            return on_sentinel(self, record)
        return real_to(self, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = real_to
