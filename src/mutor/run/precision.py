"""Which precision a run trains in: bf16 where this machine multiplies bf16 fast, float32 where it does not.

The paper fine-tunes in bfloat16. Two ways to train in bf16, both available to a recipe:

* ``model.dtype: bfloat16``: the weights themselves are bf16. mutor's real recipes use this with LoRA:
  the base is frozen, so nothing is lost by storing it in bf16, and peft keeps the adapters in float32
  (``autocast_adapter_dtype``); the register vector and the Multi-Token heads keep float32 weights
  too (:func:`mutor.methods.base.master_dtype`). With LoRA on a CPU with fast bf16 it is the fastest
  mode and needs the least activation memory.
* ``training.bf16: true`` with float32 weights: Trainer's autocast. Every trained weight keeps a float32
  copy, so it is the mode for full fine-tuning, where AdamW's steps are below bf16's resolution.

What is unusual: whether bf16 is *fast* is measured, not assumed. GPUs report it
(``torch.cuda.is_bf16_supported``); on a CPU a bf16 matrix product is timed against a float32 one (a
few milliseconds, once per process). CPUs with AVX512-BF16 or AMX run it several times faster; CPUs
without run it slower than float32 (converted element by element), and a run that asked for bf16 there
falls back to float32 with a notice (:func:`resolve_precision`) instead of running slowly.
"""

from __future__ import annotations

import functools
import time
from typing import Optional

import torch

__all__ = ["fast_bf16", "resolve_precision"]


@functools.lru_cache(maxsize=None)
def _cpu_bf16_speedup() -> float:
    """float32 time / bf16 time of one (512 x 1024) @ (1024 x 1024) product on this CPU (best of 5 each)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y                                                                 # warm-up (thread pool, kernels)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
        best[dtype] = min(times)
    return best[torch.float32] / max(best[torch.bfloat16], 1e-9)


def fast_bf16(device: str = "cpu") -> tuple[bool, str]:
    """Whether bf16 matrix products are fast on ``device`` ("cpu" or "cuda"), and the evidence in words."""
    if device.startswith("cuda"):
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "the GPU supports bf16" if ok else "the GPU does not support bf16"
    speedup = _cpu_bf16_speedup()
    return speedup > 1.0, f"a bf16 matrix product runs {speedup:.2f}x the float32 speed on this CPU"


def resolve_precision(model_dtype: str, autocast_bf16: bool, device: str) -> tuple[str, bool, Optional[str]]:
    """The (weights dtype, bf16 autocast) a run uses, and a notice when it differs from what was asked.

    bf16 weights or bf16 autocast on a device where bf16 is slow fall back to float32 (weights) and no
    autocast; everything else is kept as asked."""
    if model_dtype != "bfloat16" and not autocast_bf16:
        return model_dtype, autocast_bf16, None
    ok, why = fast_bf16(device)
    if ok:
        return model_dtype, autocast_bf16, None
    asked = " and ".join(s for s, on in (("model.dtype=bfloat16", model_dtype == "bfloat16"),
                                         ("training.bf16=true", autocast_bf16)) if on)
    return ("float32" if model_dtype == "bfloat16" else model_dtype), False, (
        f"{asked} asked for, but {why}: training in float32 instead (set model.dtype=float32 "
        "training.bf16=false to ask for it)")
