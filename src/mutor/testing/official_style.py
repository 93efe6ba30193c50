"""An "official-style" MuToR training step, written by us: the baseline the benchmark suite times, and a
reference the tests compare MuToRModel's loss with.

It does what the paper's reference code does, per the paper's description: one example at a
time (batch 1), register tokens physically interleaved after the tokens they follow, a dense
additive float 4D mask built per example, logits over the full vocabulary at every position,
and the cross-entropy over all of them. The objective is MuToR's: a register before every answer
token (after ``x_t`` when ``x_{t+1}`` is in the answer) predicts ``x_{t+d}`` with position id
``t+d-1``; regular tokens never see registers;
``(1-a) * L_ntp + a * L_reg``. Gradients are accumulated over the examples of the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["interleave", "official_example_loss", "official_step", "register_target"]


def interleave(labels_row, d: int):
    """Order of the interleaved sequence: ('tok', t) and ('reg', t) entries, registers after their source.

    The paper's rule (section 3.3, "we interleave register tokens only within the answer sequence"; the
    official code builds ``[r, a1, r, a2, ...]`` after the question): a register follows ``x_t`` exactly
    when ``x_{t+1}`` is an answer token, whatever its target; it is supervised with ``x_{t+d}`` when that
    token exists and is an answer token (see :func:`register_target`), and costs its compute either way.
    ``labels_row``: a (T,) tensor or the list of its values (host-side bookkeeping, no device sync per token)."""
    lab = labels_row.tolist() if torch.is_tensor(labels_row) else list(labels_row)
    T = len(lab)
    order = []
    for t in range(T):
        order.append(("tok", t))
        if t + 1 < T and lab[t + 1] != -100:
            order.append(("reg", t))
    return order


def register_target(lab: list, t: int, d: int) -> int:
    """The label of the register after ``x_t``: ``x_{t+d}`` if it is an answer token, else -100."""
    return lab[t + d] if t + d < len(lab) else -100


def official_example_loss(model, register_vector: torch.Tensor, ids_row: torch.Tensor, labels_row: torch.Tensor,
                          d: int, loss_weight: float) -> tuple[torch.Tensor, int]:
    """The loss of one example (interleaved registers, dense float mask, full logits) and its number of
    supervised registers (the registers present are ``interleave``'s; those without a target cost compute only)."""
    lab = labels_row.tolist()                        # host-side bookkeeping: one device sync per example
    order = interleave(lab, d)
    L = len(order)
    dev = ids_row.device
    is_reg_l = [k == "reg" for k, _ in order]
    src_l = [t for _, t in order]
    pos_l = [t + d - 1 if r else t for r, t in zip(is_reg_l, src_l)]
    tgt_l = [register_target(lab, t, d) if r else (lab[t + 1] if t + 1 < len(lab) else -100)
             for r, t in zip(is_reg_l, src_l)]
    is_reg = torch.tensor(is_reg_l, device=dev)
    src = torch.tensor(src_l, device=dev)
    emb = model.get_input_embeddings()(ids_row[None])[0]                                   # (T, C)
    x = torch.where(is_reg[:, None], register_vector.to(emb.dtype)[None], emb[src])[None]  # (1, L, C)
    # allowed(q, k): k is a regular token with source index <= q's source index, or k == q
    allowed = (~is_reg)[None, :] & (src[None, :] <= src[:, None])
    allowed |= torch.eye(L, dtype=torch.bool, device=dev)
    mask = torch.zeros(L, L, dtype=x.dtype, device=dev).masked_fill_(~allowed, torch.finfo(x.dtype).min)
    logits = model(inputs_embeds=x, attention_mask=mask[None, None], position_ids=torch.tensor([pos_l], device=dev),
                   use_cache=False).logits[0].float()                                      # (L, V): every position
    tgt = torch.tensor(tgt_l, device=dev)
    ce = F.cross_entropy(logits, tgt.clamp(min=0), reduction="none") * (tgt != -100)
    n_ntp = sum(1 for r, y in zip(is_reg_l, tgt_l) if not r and y != -100)
    n_reg = sum(1 for r, y in zip(is_reg_l, tgt_l) if r and y != -100)   # supervised registers
    ntp = ce[~is_reg].sum() / max(n_ntp, 1)
    reg = ce[is_reg].sum() / max(n_reg, 1)
    return (1 - loss_weight) * ntp + loss_weight * reg, n_reg


def official_step(model, register_vector, input_ids, labels, d_max: int, loss_weight: float,
                  generator: torch.Generator) -> tuple[float, int]:
    """Forward and backward of one batch, one example at a time; returns (mean loss, registers)."""
    total, regs = 0.0, 0
    B = input_ids.shape[0]
    for b in range(B):
        d = int(torch.randint(1, d_max + 1, (1,), generator=generator))
        loss, n = official_example_loss(model, register_vector, input_ids[b], labels[b], d, loss_weight)
        (loss / B).backward()
        total += float(loss.detach()) / B
        regs += n
    return total, regs
