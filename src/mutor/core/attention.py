"""Split attention: MuToR's register rows cost what they attend to, under ``sdpa``, with no modeling code forked.

With registers appended after the ``T`` regular tokens, a dense ``(T+R) x (T+R)`` mask makes
``sdpa`` compute every query-key pair, although

* regular queries only see regular keys (the ``T x T`` block; plain causal when there is no
  padding, packing, window or bidirectional prefix), and
* a register sees regular keys up to its source token, and itself: of the ``R x R``
  register-register block only the diagonal is ever used.

``split_sdpa_attention`` is registered in transformers' ``AttentionInterface`` under
:data:`SPLIT_ATTENTION` and computes the two query blocks separately: regular queries against
regular keys (``is_causal=True`` when the block is exactly causal, so the fused kernel skips the
upper triangle), then register queries against ``[regular keys; register keys]`` with the
register-register block masked to its diagonal. Attention cost goes from ``(T+R)^2`` to
``T^2/2 + R(T+R)`` for causal blocks; the result is the same softmax over the same keys, which
the tests check against the dense path.

On CPU (no dropout) the register rows go further and never touch the ``R x R`` block at all,
since only its diagonal is used: :class:`_RegisterRowsAttention` runs the fused CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, which also returns the log-sum-exp) over
the ``T`` regular keys only, and merges each register's own key through the log-sum-exp, i.e.
the softmax over ``T + 1`` keys: cost ``R T`` instead of ``R (T+R)``. Its backward calls the
kernel's backward with the *merged* output and log-sum-exp, which gives the full softmax's
gradients for the regular keys, and adds the self term's (``O(R D)``). The additive mask this
kernel needs is built once per forward and shared by all layers. Elsewhere (CUDA, dropout, a
register-register block that is not exactly diagonal) the register rows attend over all
``T + R`` keys as above.

:class:`MuToRModel` switches the wrapped model's ``config._attn_implementation`` to the split
function only for the duration of its own forward (:func:`split_attention_for`), and sets the
number of regular tokens through a context variable; outside it (generation, evaluation, any
other use of the base model) the model's own ``sdpa`` runs untouched.
Models whose attention does not dispatch through the ``AttentionInterface`` (falcon, stablelm:
``is_backend_compatible()`` is False) are never switched: falcon would take its eager code path
and add the boolean mask. They run their own sdpa on the dense mask, which is exact.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from .support import uses_attention_interface

SPLIT_ATTENTION = "mutor_sdpa_split"


@dataclass
class _SplitState:
    num_regular: int
    causal_masks: set = field(default_factory=set)     # data_ptr of masks whose regular block is exactly causal
    diagonal_masks: set = field(default_factory=set)   # data_ptr of masks whose register-register block is the identity
    register_bias: dict = field(default_factory=dict)  # (data_ptr, dtype) -> additive register-row mask, row has no key

    def bias_for(self, mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The register rows' mask over the regular keys as the additive (B, 1, R, T) mask the CPU flash
        kernel takes, and (B, 1, R) whether the row may attend to no regular key; once per forward."""
        key = (mask.data_ptr(), dtype)
        if key not in self.register_bias:
            allowed = mask[:, :, self.num_regular:, :self.num_regular]                      # (B, 1, R, T)
            bias = torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill_(~allowed, float("-inf"))
            self.register_bias[key] = (bias, ~allowed.any(-1))                             # (B, 1, R, T), (B, 1, R)
        return self.register_bias[key]


_STATE: contextvars.ContextVar[Optional[_SplitState]] = contextvars.ContextVar("mutor_split", default=None)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    B, H, L, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, L, D).reshape(B, H * n_rep, L, D)


def _flash_cpu_ops():
    """The CPU flash kernel and its backward (torch >= 2.2), or None where this torch lacks them."""
    fwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    return None if fwd is None or bwd is None else (fwd, bwd)


class _RegisterRowsAttention(torch.autograd.Function):
    """Register queries over ``[regular keys allowed by bias; the register's own key]``, exactly.

    Softmax over ``T + 1`` keys from the flash kernel over the ``T`` regular keys (output ``o_t``,
    log-sum-exp ``lse_t``) and the self score ``s``: ``lse = logaddexp(lse_t, s)``,
    ``out = exp(lse_t - lse) o_t + exp(s - lse) v_self``. The merge works in place on the kernel's
    output: on CPU every fresh activation-sized tensor costs page faults.
    """

    @staticmethod
    def forward(ctx, q, k, v, k_self, v_self, bias, no_key, scale: float):
        # q, k_self, v_self (B, H, R, D); k, v (B, H, T, D); bias (B, 1, R, T); no_key (B, 1, R)
        fwd, _ = _flash_cpu_ops()
        out, lse_t = fwd(q, k, v, attn_mask=bias, scale=scale)                           # (B, H, R, D), (B, H, R)
        lse_t = lse_t.masked_fill_(no_key, float("-inf"))      # the kernel reports 0 for a row with no key
        s_self = torch.linalg.vecdot(q.float(), k_self.float()) * scale                 # (B, H, R)
        lse = torch.logaddexp(lse_t, s_self)                                             # (B, H, R)
        p_self = (s_self - lse).exp_()                                                   # (B, H, R)
        out.mul_((lse_t - lse).exp_()[..., None]).addcmul_(v_self, p_self[..., None])    # (B, H, R, D)
        ctx.save_for_backward(q, k, v, k_self, v_self, bias, out, lse, p_self)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, k_self, v_self, bias, out, lse, p_self = ctx.saved_tensors
        _, bwd = _flash_cpu_ops()
        grad_out = grad_out.contiguous()                                                 # (B, H, R, D)
        # with the merged out and lse the kernel's P and rowsum(dO * O) are those of the (T+1)-key softmax
        dq, dk, dv = bwd(grad_out, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=ctx.scale)
        g32 = grad_out.float()
        d_self = torch.linalg.vecdot(g32, v_self.float()).sub_(torch.linalg.vecdot(g32, out.float()))
        d_self = d_self.mul_(p_self)[..., None]                                          # (B, H, R, 1): dL/ds_self
        dq = dq.addcmul_(k_self, d_self * ctx.scale)                                     # (B, H, R, D)
        dk_self = (q * (d_self * ctx.scale)).to(k_self.dtype)                            # (B, H, R, D)
        dv_self = (grad_out * p_self[..., None]).to(v_self.dtype)                        # (B, H, R, D)
        return dq, dk, dv, dk_self, dv_self, None, None, None


def split_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                         scaling: Optional[float] = None, **kwargs):
    """Same contract as transformers' ``sdpa_attention_forward``; returns ``(B, L, H, D)`` and no weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    state = _STATE.get()
    L = query.shape[2]
    if (state is None or attention_mask is None or not torch.is_tensor(attention_mask)
            or attention_mask.dtype != torch.bool or key.shape[2] != L or state.num_regular >= L
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    T = state.num_regular
    n_rep = getattr(module, "num_key_value_groups", 1)
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)              # (B, H, L, D)
    p = dropout if module.training else 0.0
    R = L - T
    # split, not two overlapping slices: one gradient buffer per input in backward instead of a zero-filled
    # full-size one per slice, summed
    (q_t, q_r), (k_t, k_r), (v_t, v_r) = (x.split([T, R], dim=2) for x in (query, key, value))  # (B, H, T|R, D)
    if attention_mask.data_ptr() in state.causal_masks:
        out_t = F.scaled_dot_product_attention(q_t, k_t, v_t, dropout_p=p, scale=scaling,
                                               is_causal=True)                 # (B, H, T, D)
    else:
        out_t = F.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=attention_mask[:, :, :T, :T], dropout_p=p,
                                               scale=scaling)                                   # (B, H, T, D)
    # the raw kernel takes one dtype and is not on autocast's cast list (bf16 autocast on CPU mixes
    # bf16 projections with fp32 rotary outputs): there F.scaled_dot_product_attention does the casting
    same_dtype = query.dtype == key.dtype == value.dtype and not torch.is_autocast_enabled(query.device.type)
    if (p == 0.0 and query.device.type == "cpu" and same_dtype and attention_mask.data_ptr() in state.diagonal_masks
            and _flash_cpu_ops() is not None):
        bias, no_key = state.bias_for(attention_mask, query.dtype)                            # (B, 1, R, T)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out_r = _RegisterRowsAttention.apply(q_r, k_t, v_t, k_r, v_r, bias, no_key, float(scale))  # (B, H, R, D)
    else:
        out_r = F.scaled_dot_product_attention(q_r, key, value, attn_mask=attention_mask[:, :, T:, :],
                                               dropout_p=p, scale=scaling)                      # (B, H, R, D)
    # one copy into the (B, L, H, D) layout the caller wants, not a cat and then a transpose copy
    return torch.cat([out_t.transpose(1, 2), out_r.transpose(1, 2)], dim=1), None              # (B, L, H, D)


def register() -> None:
    """Register the split attention with transformers' ``AttentionInterface`` (once; later calls do nothing)."""
    from transformers import AttentionInterface

    if SPLIT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(SPLIT_ATTENTION, split_sdpa_attention)


def _configs(model) -> Iterator:
    """The config of ``model`` and any sub-configs that carry their own attention implementation."""
    cfg = model.config
    yield cfg
    for name in getattr(cfg, "sub_configs", {}) or {}:
        sub = getattr(cfg, name, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            yield sub


@contextlib.contextmanager
def split_attention_for(model, num_regular: int, masks) -> Iterator[None]:
    """Run ``model`` (a transformers model) with split attention for one forward.

    ``masks`` is the boolean mask (or dict of masks per layer type) that will be passed to it;
    each is checked once here for an exactly causal regular block. A model whose attention does not
    go through transformers' AttentionInterface runs unchanged (its own sdpa with the dense mask).
    """
    if not uses_attention_interface(model):      # e.g. falcon: it would take its eager path with a boolean mask
        yield
        return
    register()
    state = _SplitState(num_regular)
    for m in (masks.values() if isinstance(masks, dict) else [masks]):
        block = m[:, :, :num_regular, :num_regular]                                    # (B, 1, T, T)
        causal = torch.ones(num_regular, num_regular, dtype=torch.bool, device=m.device).tril()
        if bool((block == causal).all()):
            state.causal_masks.add(m.data_ptr())
        regs = m[:, :, num_regular:, num_regular:]                                     # (B, 1, R, R)
        if bool((regs == torch.eye(regs.shape[-1], dtype=torch.bool, device=m.device)).all()):
            state.diagonal_masks.add(m.data_ptr())
    configs = list(_configs(model))
    before = [c._attn_implementation for c in configs]
    token = _STATE.set(state)
    try:
        for c in configs:
            c._attn_implementation = SPLIT_ATTENTION
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b
        _STATE.reset(token)
