"""Batched greedy decoding with a KV cache, optionally with the bidirectional prompt attention of training.

Prompts are left-padded so that every row's next token sits at the same column. With
``prefix_attention="causal"`` this is ``model.generate`` (greedy, stop at eos). With
``"bidirectional"`` the prompt is encoded once with the mask the model was trained with
(prompt tokens attend to each other both ways; padding masked; position ids counting from each
row's first real token) into a ``DynamicCache``, and decoding continues token by token from
that cache with ordinary causal attention: a generated token sees the whole prompt and the
tokens generated before it. Registers play no part at inference. A prompt plus ``max_new_tokens`` that would
run past the model's positions is refused first (:func:`check_generation_fits`), in one line, instead of an
index error deep in the model (learned positions) or generation past what it was trained on (rotary).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..core.config import check_prefix_attention
from ..data.collator import left_pad
from ..utils.devices import cache_argument

__all__ = ["check_generation_fits", "greedy_generate", "prefix_mask"]


def check_generation_fits(model, longest_prompt: int, max_new_tokens: int) -> None:
    """Refuse a generation that would run past the model's positions.

    Args:
        model: A transformers causal LM (its ``config`` is read; a model whose config names no limit passes).
        longest_prompt: Tokens of the longest prompt to generate from.
        max_new_tokens: Tokens to generate at most.

    Raises:
        MutorUserError: ``longest_prompt + max_new_tokens`` exceeds the positions, naming both numbers and the
            config field.
    """
    from ..models.positions import position_limit
    from ..utils.errors import MutorUserError

    limit = position_limit(getattr(model, "config", None))
    if limit is None or longest_prompt + max_new_tokens <= limit[0]:
        return
    n, field = limit
    room = n - longest_prompt
    fix = (f"lower max_new_tokens (mutor eval --max-new-tokens) to {room} or less" if room > 0 else
           "the prompt alone takes them all: use shorter prompts or a model with more positions")
    raise MutorUserError(f"a prompt of {longest_prompt} tokens plus max_new_tokens {max_new_tokens} needs "
                         f"{longest_prompt + max_new_tokens} positions, but the model has {n} ({field} in its "
                         f"config): {fix}")


def prefix_mask(attention_mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype,
                windows: Optional[dict] = None, position_ids: Optional[torch.Tensor] = None):
    """(B, 1, P, P) mask for encoding prompts bidirectionally: real tokens see every real token of their row.

    Training's attention rule (:func:`mutor.core.layout.regular_layout`, every label ignored so the whole
    prompt is the prefix) through training's mask builder (:func:`mutor.core.masks.build_attention_mask`):
    padding queries see only themselves (their outputs are never used; a fully masked row would give NaN);
    boolean for sdpa and flex, additive float for eager; ``windows`` (``masks.attention_windows`` of the model)
    with ``position_ids`` (default: counting from each row's first real token): a sliding-window layer sees
    a key when ``pos[q] - pos[k] < window``, as a dict keyed by layer type when the model mixes layers.
    """
    from ..core.layout import IGNORE_INDEX, regular_layout
    from ..core.masks import build_attention_mask

    am = attention_mask.bool()                                                     # (B, P)
    pos = position_ids if position_ids is not None else (am.long().cumsum(1) - 1).clamp(min=0)
    if not windows or all(w is None for w in windows.values()):
        windows = {"full_attention": None}
    layout = regular_layout(torch.full(am.shape, IGNORE_INDEX, device=am.device), "bidirectional", am, pos)
    dense = "sdpa" if attn_implementation == "flex_attention" else attn_implementation   # a (B, 1, P, P) bool
    return build_attention_mask(layout, dense, windows, dtype)


def _accepts_logits_to_keep(model) -> bool:
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@torch.no_grad()
def _decode_bidirectional(model, ids, am, max_new_tokens: int, eos_id: Optional[int], pad_id: int) -> torch.Tensor:
    """Prompt encoded once with the prefix mask, then causal decoding from the cache.

    A row that has emitted eos leaves the batch (its cache rows are dropped with
    ``Cache.batch_select_indices``), so the cost of a step follows the rows still decoding rather
    than the longest answer times the batch; the prefill keeps only the last position's logits."""
    from transformers import DynamicCache

    from ..core.masks import attention_windows

    dev = ids.device
    cfg = model.config
    attn = getattr(cfg, "_attn_implementation", None) or "eager"
    dtype = model.get_input_embeddings().weight.dtype
    keep = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
    pos = (am.cumsum(1) - 1).clamp(min=0)                                          # (B, P)
    cache = DynamicCache(config=cfg)
    mask = prefix_mask(am, attn, dtype, attention_windows(cfg.get_text_config(decoder=True)), pos)
    kv = cache_argument(model)                                                     # cache / past_key_values
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{kv: cache}, **keep)
    nxt = out.logits[:, -1].argmax(-1)                                             # (b,) rows still decoding
    gen = torch.full((ids.shape[0], max_new_tokens), pad_id, dtype=torch.long, device=dev)   # (B, n)
    rows = torch.arange(ids.shape[0], device=dev)                                  # (b,) their batch indices
    mask2d, last = am, pos[:, -1]
    n = 0
    for step in range(max_new_tokens):
        gen[rows, step] = nxt
        n = step + 1
        if step == max_new_tokens - 1:
            break
        if eos_id is not None:
            going = nxt != eos_id                                                  # (b,)
            if not bool(going.any()):
                break
            if not bool(going.all()):
                sel = going.nonzero().squeeze(1)
                cache.batch_select_indices(sel)
                rows, nxt, mask2d, last = rows[sel], nxt[sel], mask2d[sel], last[sel]
        mask2d = torch.cat([mask2d, torch.ones_like(mask2d[:, :1])], 1)              # (b, P+step+1)
        last = last + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask2d, position_ids=last[:, None], use_cache=True,
                    **{kv: cache})
        nxt = out.logits[:, -1].argmax(-1)
    return gen[:, :n]                                                              # (B, n)


@torch.no_grad()
def greedy_generate(model, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int,
                    eos_id: Optional[int] = None, prefix_attention: str = "causal") -> list[list[int]]:
    """Greedy completions (token ids, cut after eos) of one batch of tokenized prompts."""
    check_prefix_attention(prefix_attention, "prefix_attention")
    from ..utils.devices import model_device

    ids, am = left_pad(prompt_ids, pad_id)
    check_generation_fits(model, ids.shape[1], max_new_tokens)
    ids, am = ids.to(model_device(model)), am.to(model_device(model))              # (B, P)
    if prefix_attention == "causal":
        out = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad_id, eos_token_id=eos_id, num_beams=1)
        new = out[:, ids.shape[1]:]
    else:
        new = _decode_bidirectional(model, ids, am, max_new_tokens, eos_id, pad_id)
    result = []
    for row in new.cpu().tolist():
        if eos_id is not None and eos_id in row:
            row = row[:row.index(eos_id)]
        result.append(row)
    return result
