"""Attention masks for a RegisterLayout, in the form each attention backend needs.

transformers 5.x passes any 4D tensor or BlockMask straight to the attention
kernels, bypassing its own padding, causal and sliding-window logic (its ``masking_utils`` builds masks
only when none is given), so everything is folded in here:

* ``sdpa``: a boolean (B, 1, L, L) tensor, True = may attend.
* ``eager``: an additive float mask in the model's dtype (0 or finfo.min);
  eager *adds* the mask, so a boolean one would be silently wrong.
* ``flex_attention``: a ``BlockMask`` from the same rule as a ``mask_mod``; on
  CUDA it is built by one compiled, dynamic-shape ``create_block_mask`` per process,
  so no L x L tensor is materialised and new layouts or lengths do not recompile.

Models that mix sliding-window and full layers get a dict keyed by layer type
(``{"full_attention": m, "sliding_attention": m_window}``), which is what their
decoders accept in place of a mask. The rule itself is documented in layout.py.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

import torch

from .layout import RegisterLayout
from .support import ATTENTION_LAYER_TYPES

SUPPORTED_ATTENTION = ("sdpa", "eager", "flex_attention")


def attention_windows(config) -> dict[str, Optional[int]]:
    """Map each layer type of a transformers config to its window (None = full attention).

    Models without ``layer_types`` but with ``sliding_window`` set (Mistral) slide on every layer.
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not types:
        return {"full_attention": None} if window is None else {"sliding_attention": int(window)}
    unknown = sorted(set(types) - set(ATTENTION_LAYER_TYPES))
    if unknown:
        raise ValueError(
            f"{type(config).__name__} has layer types {unknown}; mutor supports {list(ATTENTION_LAYER_TYPES)}"
        )
    out: dict[str, Optional[int]] = {}
    for t in types:
        out[t] = None if t == "full_attention" else (int(window) if window is not None else None)
    return out


def allowed_dense(layout: RegisterLayout, window: Optional[int] = None) -> torch.Tensor:
    """(B, 1, L, L) bool: query row may attend to key column."""
    L = layout.position_ids.shape[1]
    idx = torch.arange(L, device=layout.position_ids.device)
    q, k = idx[:, None], idx[None, :]                                                # (L, 1), (1, L)
    same_doc = layout.doc_ids[:, :, None] == layout.doc_ids[:, None, :]              # (B, L, L)
    ok = layout.key_ok[:, None, :] & same_doc & (k[None] <= layout.limit[:, :, None])
    if window is not None:
        ok &= (layout.position_ids[:, :, None] - layout.position_ids[:, None, :]) < window
    ok |= (q == k)[None]
    return ok[:, None]                                                               # (B, 1, L, L)


def _mask_mod(layout: RegisterLayout, window: Optional[int]):
    doc, limit, key_ok, pos = layout.doc_ids, layout.limit, layout.key_ok, layout.position_ids

    def mask_mod(b, h, q, kv):
        ok = key_ok[b, kv] & (doc[b, kv] == doc[b, q]) & (kv <= limit[b, q])
        if window is not None:
            ok = ok & (pos[b, q] - pos[b, kv] < window)
        return ok | (q == kv)

    return mask_mod


@functools.lru_cache(maxsize=None)
def _compiled_create_block_mask():
    """One compiled ``create_block_mask`` per process, traced with dynamic shapes.

    Dynamo caches the compiled graph on the function, guarded on shapes and the mask_mod's
    code, not on the identity of the tensors the mask_mod closes over: a new batch layout of
    a seen shape reuses the graph, and ``dynamic=True`` keeps a new batch size or sequence
    length (padding, packing) from recompiling. Without it, the first new B and the first new L
    each cost a full recompile (minutes on a CPU); with it, one compile, and then a new layout,
    B or L costs about what the eager builder does (tests/test_block_mask_compiled.py).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask, dynamic=True)


def block_mask(layout: RegisterLayout, window: Optional[int] = None, compile: Optional[bool] = None):
    """A FlexAttention BlockMask for the layout.

    ``compile`` (default: on CUDA) builds it with the process's compiled ``create_block_mask``,
    which evaluates the mask_mod block by block on device; the eager builder materialises a
    (B, 1, L, L) boolean first, which is fine for CPU tests and wrong for long sequences.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    B, L = layout.position_ids.shape
    dev = layout.position_ids.device
    if compile is None:
        compile = dev.type == "cuda"
    build = _compiled_create_block_mask() if compile else create_block_mask
    return build(_mask_mod(layout, window), B, None, L, L, device=dev)


def build_attention_mask(
    layout: RegisterLayout, attn_implementation: str, windows: dict[str, Optional[int]], dtype: torch.dtype
) -> Union[torch.Tensor, dict]:
    """The mask argument to pass to the model: one mask, or a dict per layer type."""
    if attn_implementation not in SUPPORTED_ATTENTION:
        raise ValueError(f"attention implementation {attn_implementation!r} cannot take a custom mask; "
                         f"use one of {SUPPORTED_ATTENTION}")
    cache: dict[Optional[int], object] = {}
    for w in set(windows.values()):
        if attn_implementation == "flex_attention":
            cache[w] = block_mask(layout, w)
        else:
            allowed = allowed_dense(layout, w)
            if attn_implementation == "eager":
                allowed = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
                    ~allowed, torch.finfo(dtype).min)
            cache[w] = allowed
    if len(windows) == 1:
        return cache[next(iter(windows.values()))]
    return {t: cache[w] for t, w in windows.items()}
