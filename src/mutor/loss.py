"""Chunked linear + cross-entropy: the vocabulary-sized logits are never held for all rows at once.

MuToR takes a loss at every supervised token and every register, so the ``(N, V)`` logits of a
batch are large (8,704 x 32,000 floats = 1.1 GB for a batch of 8 x 576 tokens with 512
registers per row). :func:`fused_linear_cross_entropy` computes the output projection, any
final soft-capping, the cross-entropy *and its gradients* chunk by chunk in the forward pass
(the gradient of the weighted cross-entropy sum with respect to the logits is
``w * (softmax - onehot)``, known once the loss weights are), keeping only ``dL/dhidden``
``(N, C)`` and ``dL/dweight`` ``(V, C)`` for the backward pass, which merely scales them. The
matrix products are the same three an unchunked projection costs; peak memory holds one chunk.

Only the weighted total is differentiable; per-row cross-entropies and top-1 hits come back
detached for the metrics.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["fused_linear_cross_entropy", "head_cross_entropy"]


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, row_weight, softcap: Optional[float], chunk: int):
        N = hidden.shape[0]
        ce = torch.empty(N, dtype=torch.float32, device=hidden.device)
        hit = torch.empty(N, dtype=torch.bool, device=hidden.device)
        grad_h = torch.empty_like(hidden)                                              # (N, C)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)                         # (V, C)
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        for s in range(0, N, chunk):
            h = hidden[s:s + chunk]                                                    # (n, C)
            tgt = targets[s:s + chunk]
            z = h @ weight.t()                                                         # (n, V)
            if bias is not None:
                z = z + bias
            z = z.float()
            if softcap:
                t = torch.tanh(z / softcap)
                logits = t * softcap
            else:
                logits = z
            # one max, one exp and one sum pass give the loss, the top-1 hit and the softmax; the
            # (n, V) buffer is reused in place (logits are not needed once exponentiated)
            m = logits.amax(-1, keepdim=True)                                          # (n, 1)
            tl = logits.gather(1, tgt[:, None]).squeeze(1)                             # (n,)
            hit[s:s + chunk] = tl >= m[:, 0]
            g = logits.sub_(m).exp_()                                                  # (n, V)
            total = g.sum(-1, keepdim=True)                                            # (n, 1)
            ce[s:s + chunk] = (m + total.log())[:, 0] - tl
            w = row_weight[s:s + chunk]
            g.mul_(w[:, None] / total)                                                 # w * softmax
            g[torch.arange(len(tgt), device=g.device), tgt] -= w                       # w * (softmax - onehot)
            if softcap:
                g *= 1.0 - t * t                                                       # through tanh soft-capping
            g_lp = g.to(h.dtype)
            grad_h[s:s + chunk] = g_lp @ weight
            grad_w += (g_lp.t() @ h).float()
            if grad_b is not None:
                grad_b += g.sum(0)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype), None if grad_b is None else grad_b.to(bias.dtype))
        ctx.has_bias = bias is not None
        loss = (ce * row_weight).sum()
        ctx.mark_non_differentiable(ce, hit)
        return loss, ce, hit

    @staticmethod
    def backward(ctx, g_loss, _g_ce, _g_hit):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        return (grad_h * g_loss.to(grad_h.dtype), grad_w * g_loss.to(grad_w.dtype),
                grad_b * g_loss.to(grad_b.dtype) if ctx.has_bias else None, None, None, None, None)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               targets: torch.Tensor, row_weight: torch.Tensor, softcap: Optional[float] = None,
                               chunk: int = 1024):
    """``(sum_i row_weight[i] * CE_i, CE (detached), top-1 hit (detached))`` for rows ``hidden`` (N, C).

    ``weight``/``bias`` are the output layer's; ``softcap`` applies ``cap * tanh(z / cap)`` to the logits
    (Gemma 2's final soft-capping). ``row_weight`` carries the loss weighting and normalisation.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 (got {chunk})")
    return _FusedLinearCE.apply(hidden, weight, bias, targets, row_weight.float(), softcap, int(chunk))


def head_cross_entropy(model, hidden: torch.Tensor, targets: torch.Tensor, is_aux: torch.Tensor, aux_weight: float,
                       main_den, aux_den, chunk: int):
    """:func:`fused_linear_cross_entropy` through ``model``'s own output layer (and final soft-capping), for
    the two-part objective ``(1 - a) * sum(main CE) / main_den + a * sum(aux CE) / aux_den``;
    ``is_aux`` (N,) marks the auxiliary rows (registers, extra heads)."""
    dev = hidden.device
    row_weight = torch.where(is_aux, torch.as_tensor(aux_weight / aux_den, device=dev, dtype=torch.float32),
                             torch.as_tensor((1.0 - aux_weight) / main_den, device=dev, dtype=torch.float32))
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    return fused_linear_cross_entropy(hidden, head.weight, head.bias, targets, row_weight, cap, chunk)
