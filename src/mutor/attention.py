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


_STATE: contextvars.ContextVar[Optional[_SplitState]] = contextvars.ContextVar("mutor_split", default=None)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    B, H, L, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, L, D).reshape(B, H * n_rep, L, D)


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
    if attention_mask.data_ptr() in state.causal_masks:
        out_t = F.scaled_dot_product_attention(query[:, :, :T], key[:, :, :T], value[:, :, :T],
                                               dropout_p=p, scale=scaling, is_causal=True)      # (B, H, T, D)
    else:
        out_t = F.scaled_dot_product_attention(query[:, :, :T], key[:, :, :T], value[:, :, :T],
                                               attn_mask=attention_mask[:, :, :T, :T], dropout_p=p, scale=scaling)
    out_r = F.scaled_dot_product_attention(query[:, :, T:], key, value, attn_mask=attention_mask[:, :, T:, :],
                                           dropout_p=p, scale=scaling)                          # (B, H, R, D)
    out = torch.cat([out_t, out_r], dim=2)                                                      # (B, H, L, D)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
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
