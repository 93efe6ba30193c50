"""Which transformers causal-LM families MuToR can train exactly, and a clear refusal for the others.

MuToR asks two things of a model, and nothing else (no modeling code is forked):

1. **Positions come from ``position_ids``.** A register sits physically after the regular
   tokens but must take position ``t+d-1``. Rotary, learned absolute and no-position (NoPE)
   models read positions from ``position_ids``; ALiBi models (bloom, mpt, falcon with
   ``alibi=True``) build a distance bias from the 2D padding mask's physical indices instead,
   so a register cannot be given its position, and a custom 4D mask (registers, packed
   documents, bidirectional prefix) either crashes them (bloom) or is silently combined with
   the wrong bias (mpt, falcon).
2. **Tokens mix only through attention under the mask mutor passes.** State-space, recurrent,
   linear-attention and convolution layers (mamba, rwkv, jamba, ...) carry a state along the
   physical sequence: registers would feed into later registers and packed documents into one
   another, and no attention mask can stop it. Chunked attention layers (llama4) are
   not implemented by mutor's masks.

Everything else is verified family by family (tests/test_families.py).
This module is the one place that says what is refused and why: :func:`check_supported` is called
by :class:`~mutor.methods.mutor.MuToRModel` and by the Multi-Token baseline, whose heads share the
same masks for packed documents and the bidirectional prefix.

:func:`uses_attention_interface` says whether the model's attention goes through transformers'
``AttentionInterface`` (``is_backend_compatible``); only then may :mod:`mutor.core.attention` swap in
its split sdpa function. Models that test ``_attn_implementation == "sdpa"`` themselves (falcon)
would otherwise fall back to their eager code and *add* the boolean mask (silently wrong by ~1e-3).
"""

from __future__ import annotations

from torch import nn

ALIBI = ("ALiBi positions: the model builds its position bias from the physical index in the 2D padding mask, "
         "not from position_ids, so a register cannot take position t+d-1 and MuToR's custom attention mask "
         "is not combined with the bias")
RECURRENT = ("state-space / recurrent / convolution layers carry a state along the physical sequence, outside "
             "attention, so registers would leak into later tokens and packed documents into each other; no "
             "attention mask can prevent it")
CHUNKED = ("chunked attention layers (attention within fixed chunks of positions) are not implemented by "
           "mutor's masks")

# model_type -> reason; hybrids whose config lists non-attention layer types are also caught by layer_types below
REFUSED: dict[str, str] = {
    "bloom": ALIBI,
    "mpt": ALIBI,
    "mamba": RECURRENT,
    "mamba2": RECURRENT,
    "falcon_mamba": RECURRENT,
    "rwkv": RECURRENT,
    "xlstm": RECURRENT,
    "jamba": RECURRENT,
    "bamba": RECURRENT,
    "zamba": RECURRENT,
    "zamba2": RECURRENT,
    "falcon_h1": RECURRENT,
    "granitemoehybrid": RECURRENT,
    "nemotron_h": RECURRENT,
    "recurrent_gemma": RECURRENT,
    "llama4_text": CHUNKED,
}
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


def refusal_reason(config) -> str | None:
    """Why a model with this transformers config cannot be trained exactly with registers (None: it can)."""
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED:
        return REFUSED[model_type]
    if getattr(config, "alibi", False) is True:                     # falcon with alibi=True
        return ALIBI
    other = sorted(set(getattr(config, "layer_types", None) or ()) - set(ATTENTION_LAYER_TYPES))
    if other:
        return (CHUNKED if other == ["chunked_attention"] else RECURRENT) + f" (layer types {other})"
    return None


def check_supported(model: nn.Module, owner: str = "MuToR") -> None:
    """A ValueError naming the model class, its model_type and the reason if ``owner`` cannot train it exactly."""
    config = getattr(model, "config", None)
    reason = refusal_reason(config)
    if reason is not None:
        raise ValueError(f"{type(model).__name__} (model_type {getattr(config, 'model_type', None)!r}) is not "
                         f"supported by {owner}: {reason}")


def uses_attention_interface(model: nn.Module) -> bool:
    """True when the model's attention dispatches through transformers' AttentionInterface."""
    compatible = getattr(model, "is_backend_compatible", None)
    return bool(compatible()) if callable(compatible) else False
