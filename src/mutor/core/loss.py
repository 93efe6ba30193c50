"""Chunked linear + cross-entropy: the vocabulary-sized logits are never held for all rows at once.

MuToR takes a loss at every supervised token and every register, so the ``(N, V)`` logits of a
batch are large (8,704 x 32,000 floats = 1.1 GB for a batch of 8 x 576 tokens with 512
registers per row). :func:`fused_linear_cross_entropy` computes the output projection, any
final soft-capping, the cross-entropy *and its gradients* chunk by chunk in the forward pass
(the gradient of the weighted cross-entropy sum with respect to the logits is
``w * (softmax - onehot)``, known once the loss weights are), keeping only ``dL/dhidden``
``(N, C)`` and ``dL/dweight`` ``(V, C)`` for the backward pass, which merely scales them. The
matrix products are the same three an unchunked projection costs; peak memory holds one chunk.

Only the gradients that are needed are computed: under ``torch.no_grad`` (evaluation) none (the
log-sum-exp only: no gradient buffer, one matrix product per chunk), with a frozen output layer (LoRA) no
``dL/dweight`` (neither its fp32 ``(V, C)`` buffer nor its vocabulary-sized product).

Only the weighted total is differentiable; per-row cross-entropies and top-1 hits come back
detached for the metrics.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["fused_linear_cross_entropy", "head_cross_entropy", "top1_hits"]


class _FusedLinearCE(torch.autograd.Function):
    """Loss, CE and hits in the forward, with the gradients of the inputs that need one (see the module doc)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, row_weight, softcap: Optional[float], chunk: int):
        # apply() is only reached with grad mode on (see fused_linear_cross_entropy), where
        # needs_input_grad is exactly "this input requires grad"
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        loss, ce, hit, grads = _chunked_ce(hidden, weight, bias, targets, row_weight, softcap, chunk,
                                           need_h, need_w, need_b and bias is not None)
        ctx.save_for_backward(*grads)
        ctx.mark_non_differentiable(ce, hit)
        return loss, ce, hit

    @staticmethod
    def backward(ctx, g_loss, _g_ce, _g_hit):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        scaled = [None if g is None else g * g_loss.to(g.dtype) for g in (grad_h, grad_w, grad_b)]
        return (*scaled, None, None, None, None)


def _chunked_ce(hidden, weight, bias, targets, row_weight, softcap, chunk, need_h: bool, need_w: bool, need_b: bool):
    """``(loss, ce, hit, (grad_h, grad_w, grad_b))``, chunk by chunk; a gradient not asked for is None and
    costs nothing: no buffer, no matrix product (with none asked for, no softmax either).

    Every chunk works in the same few ``(chunk, V)`` buffers, allocated once per call: a fresh
    vocabulary-sized tensor per chunk costs one page fault per 4 KiB on CPU (the allocator hands
    blocks this large back to the kernel when they are freed), about a third of a CPU step's loss time.
    """
    N, V = hidden.shape[0], weight.shape[0]
    dev, low = hidden.device, hidden.dtype != torch.float32
    ce = torch.empty(N, dtype=torch.float32, device=dev)
    hit = torch.empty(N, dtype=torch.bool, device=dev)
    grad_h = torch.empty_like(hidden) if need_h else None                                   # (N, C)
    grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None              # (V, C)
    grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None                # (V,)
    need_logit_grad = need_h or need_w or need_b
    rows = min(chunk, N)
    z_buf = torch.empty(rows, V, dtype=hidden.dtype, device=dev)                           # projection, then dL/dz
    f_buf = torch.empty(rows, V, dtype=torch.float32, device=dev) if low else z_buf        # fp32 logits
    t_buf = torch.empty(rows, V, dtype=torch.float32, device=dev) if softcap else None     # tanh(z / cap)
    for s in range(0, N, chunk):
        h = hidden[s:s + chunk]                                                            # (n, C)
        tgt = targets[s:s + chunk]
        n = h.shape[0]
        z = torch.mm(h, weight.t(), out=z_buf[:n])                                         # (n, V)
        if bias is not None:
            z.add_(bias)
        logits = f_buf[:n].copy_(z) if low else z                                          # (n, V) fp32
        if softcap:
            t = torch.div(logits, softcap, out=t_buf[:n]).tanh_()                          # (n, V)
            logits = torch.mul(t, softcap, out=logits)
        # one max, one exp and one sum pass give the loss, the top-1 hit and the softmax; the
        # (n, V) buffer is reused in place (logits are not needed once exponentiated)
        m = logits.amax(-1, keepdim=True)                                                  # (n, 1)
        tl = logits.gather(1, tgt[:, None]).squeeze(1)                                     # (n,)
        hit[s:s + chunk] = tl >= m[:, 0]
        g = logits.sub_(m).exp_()                                                          # (n, V)
        total = g.sum(-1, keepdim=True)                                                    # (n, 1)
        ce[s:s + chunk] = (m + total.log())[:, 0] - tl
        if not need_logit_grad:
            continue
        w = row_weight[s:s + chunk]
        g.mul_(w[:, None] / total)                                                         # w * softmax
        g[torch.arange(n, device=dev), tgt] -= w                                           # w * (softmax - onehot)
        if softcap:
            g.mul_(t.mul_(t).neg_().add_(1.0))                                             # through tanh: 1 - t^2
        g_lp = z_buf[:n].copy_(g) if low else g                                            # (n, V) in h's dtype
        if need_h:
            torch.mm(g_lp, weight, out=grad_h[s:s + chunk])                                # (n, C)
        if need_w:
            if low:
                grad_w += (g_lp.t() @ h).float()                                           # (V, C)
            else:
                grad_w.addmm_(g_lp.t(), h)                                                 # (V, C)
        if need_b:
            grad_b += g.sum(0)                                                             # (V,)
    loss = (ce * row_weight).sum()
    grads = (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
             None if grad_b is None else grad_b.to(bias.dtype))
    return loss, ce, hit, grads


@torch.no_grad()
def top1_hits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(N,) bool: the target is a top-1 choice of its row (ties count as correct), without copying rows out of
    the (N, V) logits; the chunked loss computes the same inside its own max pass."""
    return logits.gather(1, targets[:, None]).squeeze(1) >= logits.amax(-1)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               targets: torch.Tensor, row_weight: torch.Tensor, softcap: Optional[float] = None,
                               chunk: int = 1024):
    """``(sum_i row_weight[i] * CE_i, CE (detached), top-1 hit (detached))`` for rows ``hidden`` (N, C).

    ``weight``/``bias`` are the output layer's; ``softcap`` applies ``cap * tanh(z / cap)`` to the logits
    (Gemma 2's final soft-capping). ``row_weight`` carries the loss weighting and normalisation.
    Gradients are computed (in this call) only for the inputs that require grad, and none under
    ``torch.no_grad`` (evaluation): a frozen output layer (LoRA) costs no ``(V, C)`` buffer and no
    vocabulary-sized gradient product.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 (got {chunk})")
    row_weight = row_weight.float()
    differentiable = [t for t in (hidden, weight, bias) if t is not None and t.requires_grad]
    if not (torch.is_grad_enabled() and differentiable):
        # Function.apply reports needs_input_grad=True under no_grad too, so it is not used here
        loss, ce, hit, _ = _chunked_ce(hidden.detach(), weight.detach(), None if bias is None else bias.detach(),
                                       targets, row_weight, softcap, int(chunk), False, False, False)
        return loss, ce, hit
    return _FusedLinearCE.apply(hidden, weight, bias, targets, row_weight, softcap, int(chunk))


def head_cross_entropy(model, hidden: torch.Tensor, targets: torch.Tensor, row_weight: torch.Tensor, chunk: int):
    """:func:`fused_linear_cross_entropy` through ``model``'s own output layer (and final soft-capping);
    ``row_weight`` (N,) is each row's weight in the objective (:func:`mutor.methods.objective.row_weights`)."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    return fused_linear_cross_entropy(hidden, head.weight, head.bias, targets, row_weight, cap, chunk)
