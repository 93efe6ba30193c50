"""Gradient clipping that leaves the trained model's update alone.

``max_grad_norm`` in ``transformers.Trainer`` clips the joint norm of every trainable parameter.
A training wrapper adds parameters of its own (MuToR's register vector, the Multi-Token baseline's
heads), and under LoRA their gradient can dominate that joint norm (early in a LoRA run the register
vector's gradient can be most of it), so that with ``max_grad_norm=1.0`` every adapter update would be
scaled down several times while the next-token run, with no register, is not clipped at all. MuToR
should change the objective and nothing else, so by default
(``"separate"``) the two groups are clipped each against ``max_grad_norm`` on its own:

* the model's parameters (everything under ``wrapper.base_model``: the full model, or the LoRA
  adapters) get exactly the clipping they would get without mutor;
* the wrapper's own parameters get the same threshold on their own norm.

``"joint"`` is Trainer's own clipping of all parameters together, which is also what the paper's
official code does (it fine-tunes the full model, where one embedding row is a small share of the
norm; under LoRA it is most of it).

What is unusual: the norms are computed as Trainer computes them for gradients that live on different
device meshes (``torch.nn.utils.get_total_norm`` per mesh, a DTensor norm made whole), so a group may be
plain tensors (one process, DDP: gradients are already reduced) or FSDP2 DTensor shards. FSDP1's flat
parameters and DeepSpeed (which clips inside its engine) mix the groups in one buffer and cannot be
split: there only ``"joint"`` runs, and ``"separate"`` is refused by name before training starts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

import torch
from torch import nn

__all__ = ["GRAD_CLIP_MODES", "check_grad_clip", "grad_norm", "clip_group"]

GRAD_CLIP_MODES = ("separate", "joint")


def check_grad_clip(mode: str, fsdp1: bool = False, deepspeed: bool = False) -> None:
    """A ValueError unless ``mode`` is a known clipping mode that this distributed backend can run."""
    if mode not in GRAD_CLIP_MODES:
        raise ValueError(f"grad_clip must be one of {list(GRAD_CLIP_MODES)} (got {mode!r})")
    if mode == "separate" and (fsdp1 or deepspeed):
        backend = "DeepSpeed clips inside its engine" if deepspeed else "FSDP1's flat parameters mix both groups"
        raise ValueError(f"grad_clip='separate' needs gradients that can be split into the model's and the wrapper's "
                         f"({backend}): use FSDP2 (fsdp_version: 2) or DDP, or set grad_clip='joint' (Trainer's "
                         "own clipping of all parameters together, as the paper's official code does)")


def grad_norm(params: Iterable[nn.Parameter]) -> Optional[torch.Tensor]:
    """The L2 norm of the gradients of ``params`` (None when none has a gradient); FSDP2 shards made whole."""
    from torch.distributed.tensor import DTensor
    from torch.nn.utils import get_total_norm

    by_mesh = defaultdict(list)
    for p in params:
        if p.grad is not None:
            by_mesh[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p.grad)
    if not by_mesh:
        return None
    norms = []
    for grads in by_mesh.values():
        n = get_total_norm(grads)
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def clip_group(params: list[nn.Parameter], max_norm: float) -> Optional[torch.Tensor]:
    """Scale the gradients of ``params`` so that their joint norm is at most ``max_norm`` (the formula of
    ``torch.nn.utils.clip_grad_norm_``); returns the norm before clipping (None without gradients)."""
    from torch.nn.utils import clip_grads_with_norm_

    total = grad_norm(params)
    if total is not None and max_norm != float("inf"):
        with_grad = [p for p in params if p.grad is not None]
        clip_grads_with_norm_(with_grad, max_norm, total)
    return total
