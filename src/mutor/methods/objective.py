"""The objective every method computes, and what its forward returns: ``(1 - a) * L_ntp + a * L_reg``.

A wrapper's forward computes per-row cross-entropies (next-token rows and auxiliary rows: MuToR's
registers, the Multi-Token heads' targets) and hands them to :func:`objective_output`, which resolves the
two denominators and divides, once, for the loss and for every reported mean. What is unusual: the
denominators are the whole accumulated batch's counts when the trainer gives them (``num_items_in_batch``,
``num_registers_in_batch``), so gradient accumulation gives the update of one large batch; and the output
also carries the sums, which the trainer adds up across micro-batches and logging windows. The chunked loss
(:mod:`mutor.core.loss`) weights its rows beforehand with :func:`row_weights`, the same division.

The auxiliary objective is called ``reg`` everywhere (the paper's L_reg); for the Multi-Token baseline the
"registers" are its extra heads' targets, reported under the same names so the methods compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers.utils import ModelOutput

__all__ = ["MuToROutput", "objective_output", "row_weights"]


@dataclass
class MuToROutput(ModelOutput):
    """What every wrapper's forward returns (MuToR, the Multi-Token baseline, the next-token baseline).

    For the Multi-Token baseline the "registers" are its extra heads' targets, reported under the same names.
    Per-offset tensors follow the wrapper's :meth:`~mutor.methods.base.TrainingWrapper.offset_names`; an offset
    with no register in the batch (``reg_count_per_offset`` 0) has NaN loss and accuracy, not 0.

    Attributes:
        loss: ``(1 - a) * ntp_loss + a * reg_loss``, the loss to backpropagate.
        ntp_loss: Mean next-token cross-entropy.
        reg_loss: Mean register cross-entropy.
        reg_accuracy: Share of registers whose top-1 prediction is their target.
        reg_loss_per_offset: (K,) mean register cross-entropy per offset.
        reg_accuracy_per_offset: (K,) register top-1 accuracy per offset.
        reg_count_per_offset: (K,) registers per offset in this batch.
        num_registers: Registers in this batch.
        num_ntp_tokens: Next-token targets in this batch.
        logits: With ``return_logits=True`` (MuToR without ``loss_chunk_size``): (N, V) logits of the loss rows,
            in the order of ``layout.loss_rows()``.
        layout: With ``return_logits=True``: the batch's :class:`~mutor.RegisterLayout`.
        ntp_loss_sum: Sum that ``ntp_loss`` divides (detached); the trainer accumulates it.
        reg_loss_sum: Sum that ``reg_loss`` divides (detached).
        reg_loss_sum_per_offset: (K,) sums that ``reg_loss_per_offset`` divides.
        reg_hits_per_offset: (K,) top-1 hits per offset.
    """

    loss: Optional[torch.Tensor] = None
    ntp_loss: Optional[torch.Tensor] = None
    reg_loss: Optional[torch.Tensor] = None
    reg_accuracy: Optional[torch.Tensor] = None
    reg_loss_per_offset: Optional[torch.Tensor] = None
    reg_accuracy_per_offset: Optional[torch.Tensor] = None
    reg_count_per_offset: Optional[torch.Tensor] = None
    num_registers: Optional[int] = None
    num_ntp_tokens: Optional[int] = None
    logits: Optional[torch.Tensor] = None
    layout: Optional[Any] = None
    ntp_loss_sum: Optional[torch.Tensor] = None
    reg_loss_sum: Optional[torch.Tensor] = None
    reg_loss_sum_per_offset: Optional[torch.Tensor] = None
    reg_hits_per_offset: Optional[torch.Tensor] = None


def _denominators(n_ntp: int, n_reg: int, num_items_in_batch, num_registers_in_batch):
    """The loss denominators: the accumulated batch's counts when the trainer gives them, else this batch's."""
    ntp_den = num_items_in_batch if num_items_in_batch is not None else max(n_ntp, 1)
    reg_den = num_registers_in_batch if num_registers_in_batch is not None else max(n_reg, 1)
    return ntp_den, reg_den


def row_weights(is_reg: torch.Tensor, a: float, num_items_in_batch=None, num_registers_in_batch=None) -> torch.Tensor:
    """(N,) weight of each loss row in ``(1-a) * L_ntp + a * L_reg`` (what the chunked loss sums)."""
    n_reg = int(is_reg.sum())
    ntp_den, reg_den = _denominators(len(is_reg) - n_reg, n_reg, num_items_in_batch, num_registers_in_batch)
    dev = is_reg.device
    return torch.where(is_reg, torch.as_tensor(a / reg_den, device=dev, dtype=torch.float32),
                       torch.as_tensor((1.0 - a) / ntp_den, device=dev, dtype=torch.float32))


def objective_output(ce: torch.Tensor, is_reg: torch.Tensor, reg_hit: torch.Tensor, reg_choice: torch.Tensor,
                     num_offsets: int, a: float, num_items_in_batch=None, num_registers_in_batch=None,
                     loss: Optional[torch.Tensor] = None, **extra: Any) -> MuToROutput:
    """``(1-a) * L_ntp + a * L_reg`` and every reported mean, from per-row cross-entropies: the one division.

    ``ce`` (N,) cross-entropy of each loss row, ``is_reg`` (N,) which rows are registers (or head targets),
    ``reg_hit`` (n_reg,) top-1 hits and ``reg_choice`` (n_reg,) offset indices of the register rows in row
    order. ``loss``: already computed (the chunked loss weights its rows with :func:`row_weights`), else
    formed here. ``num_items_in_batch`` / ``num_registers_in_batch``: the accumulated batch's counts.
    """
    n_reg = int(is_reg.sum())
    n_ntp = len(ce) - n_reg
    ntp_den, reg_den = _denominators(n_ntp, n_reg, num_items_in_batch, num_registers_in_batch)
    ce_reg = ce[is_reg]                                                                  # (n_reg,)
    ntp_sum, reg_sum = ce[~is_reg].sum(), ce_reg.sum()
    ntp_loss, reg_loss = ntp_sum / ntp_den, reg_sum / reg_den
    if loss is None:
        loss = ntp_loss if a == 0 else (1.0 - a) * ntp_loss + a * reg_loss
    with torch.no_grad():
        dev = ce.device
        hits = reg_hit.float()
        count_k = torch.bincount(reg_choice, minlength=num_offsets).float()               # (K,)
        loss_k = torch.zeros(num_offsets, device=dev).index_add_(0, reg_choice, ce_reg.detach().float())
        hit_k = torch.zeros(num_offsets, device=dev).index_add_(0, reg_choice, hits)
        denom_k = torch.where(count_k > 0, count_k, torch.nan)   # no register of an offset: NaN, not 0
    return MuToROutput(
        loss=loss, ntp_loss=ntp_loss, reg_loss=reg_loss, reg_accuracy=hits.sum() / max(n_reg, 1),
        reg_loss_per_offset=loss_k / denom_k, reg_accuracy_per_offset=hit_k / denom_k, reg_count_per_offset=count_k,
        num_registers=n_reg, num_ntp_tokens=n_ntp, ntp_loss_sum=ntp_sum.detach(), reg_loss_sum=reg_sum.detach(),
        reg_loss_sum_per_offset=loss_k, reg_hits_per_offset=hit_k, **extra)
