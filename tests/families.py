"""Tiny random models of several families, built in process (no downloads).

Each entry builds a fp32 model in eval mode. ``window`` sets the sliding window
of the families that have one (None: a window far larger than any test sequence,
so it exists in the model but never binds).
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 61
BIG_WINDOW = 4096
_common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
               bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _llama(attn, window):
    return LlamaForCausalLM(LlamaConfig(**_common, attn_implementation=attn))


def _qwen2(attn, window):
    # layer 0 full attention, layer 1 sliding: a model that mixes both kinds of layers
    cfg = Qwen2Config(**_common, use_sliding_window=True, sliding_window=window or BIG_WINDOW,
                      max_window_layers=1, attn_implementation=attn)
    return Qwen2ForCausalLM(cfg)


def _gemma2(attn, window):
    cfg = Gemma2Config(**_common, head_dim=16, sliding_window=window or BIG_WINDOW,
                       attn_implementation="eager" if attn == "sdpa" else attn)
    return Gemma2ForCausalLM(cfg)


def _qwen3(attn, window):
    cfg = Qwen3Config(**_common, head_dim=16, use_sliding_window=True, sliding_window=window or BIG_WINDOW,
                      max_window_layers=1, attn_implementation=attn)
    return Qwen3ForCausalLM(cfg)


def _gemma3(attn, window):
    # sliding_window_pattern 2: layer 0 sliding, layer 1 full
    cfg = Gemma3TextConfig(**_common, head_dim=16, sliding_window=window or BIG_WINDOW,
                           layer_types=["sliding_attention", "full_attention"], attn_implementation=attn)
    return Gemma3ForCausalLM(cfg)


def _mistral(attn, window):
    return MistralForCausalLM(MistralConfig(**_common, sliding_window=window or BIG_WINDOW, attn_implementation=attn))


def _gpt2(attn, window):
    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=256,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation=attn)
    return GPT2LMHeadModel(cfg)


FAMILIES = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "gemma2": _gemma2, "gemma3": _gemma3,
            "mistral": _mistral, "gpt2": _gpt2}
SLIDING = ["qwen2", "qwen3", "gemma2", "gemma3", "mistral"]
FLEX = ["llama", "qwen2", "mistral"]


def make_model(family: str, attn: str = "sdpa", window: int | None = None, seed: int = 0):
    torch.manual_seed(seed)
    return FAMILIES[family](attn, window).eval()


def padded_batch(seed: int = 0, lengths=(14, 9, 11), prompts=(4, 3, 0)):
    """Right-padded prompt/completion batch of unequal lengths (labels -100 on prompt and padding)."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), T), generator=g)
    am = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for b, (n, p) in enumerate(zip(lengths, prompts)):
        am[b, :n] = 1
        labels[b, p:n] = ids[b, p:n]
        ids[b, n:] = 0
    return {"input_ids": ids, "attention_mask": am, "labels": labels}


def packed_batch(seed: int = 0, docs=((6, 2), (5, 0), (7, 3)), rows=2):
    """Packed batch like DataCollatorWithFlattening: position ids restart, -100 on each doc's first label."""
    g = torch.Generator().manual_seed(seed)
    T = sum(n for n, _ in docs)
    ids = torch.randint(3, VOCAB, (rows, T), generator=g)
    pos = torch.cat([torch.arange(n) for n, _ in docs]).expand(rows, T).clone()
    labels = ids.clone()
    start = 0
    for n, p in docs:
        labels[:, start:start + max(p, 1)] = -100
        start += n
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


# ----------------------------------------------------------------------------- the family matrix
# Every further family, one row each: model_type -> (extra config kwargs, attention implementation,
# what it exercises). Built from transformers' own config class with the tiny shape of `_common`;
# tests/test_families.py checks both invariants on each.
_MOE = dict(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_MIXED = dict(sliding_window=BIG_WINDOW, layer_types=["sliding_attention", "full_attention"])
MORE_FAMILIES: dict[str, tuple[dict, str, str]] = {
    "phi3": ({}, "sdpa", "fused qkv"),
    "olmo2": ({}, "sdpa", "qk-norm"),
    "olmo3": (_MIXED, "sdpa", "sliding + full layers"),
    "granite": (dict(embedding_multiplier=2.0, attention_multiplier=0.1, residual_multiplier=0.5,
                     logits_scaling=4.0), "sdpa", "embedding / attention / residual / logit multipliers"),
    "cohere": ({}, "sdpa", "parallel block, logit scale"),
    "cohere2": (_MIXED, "sdpa", "sliding + full layers (NoPE on full layers)"),
    "starcoder2": (dict(sliding_window=BIG_WINDOW), "sdpa", "sliding window, biases"),
    "stablelm": ({}, "sdpa", "partial rotary (25%); attention not through AttentionInterface"),
    "gemma": (dict(head_dim=16), "sdpa", "sqrt(hidden) embedding scale"),
    "phi": ({}, "sdpa", "partial rotary (50%), parallel block"),
    "gpt_neox": ({}, "sdpa", "partial rotary (25%), parallel residual"),
    "persimmon": ({}, "sdpa", "partial rotary (50%), qk layer norm"),
    "smollm3": (dict(no_rope_layers=[1, 0]), "sdpa", "NoPE layers mixed with rotary layers"),
    "helium": (dict(head_dim=16), "sdpa", ""),
    "glm4": (dict(head_dim=16), "sdpa", "partial rotary (50%), extra norms"),
    "exaone4": (_MIXED, "sdpa", "sliding + full layers"),
    "falcon": ({}, "sdpa", "rotary (alibi=False), parallel attention, multi-query; own sdpa call"),
    "gpt_bigcode": ({}, "sdpa", "learned absolute positions, multi-query"),
    "opt": (dict(ffn_dim=128, word_embed_proj_dim=64), "sdpa", "learned absolute positions (offset 2)"),
    "mixtral": (dict(_MOE, sliding_window=BIG_WINDOW), "sdpa", "MoE, sliding window"),
    "qwen3_moe": (_MOE, "sdpa", "MoE"),
    "qwen2_moe": (dict(_MOE, shared_expert_intermediate_size=64), "sdpa", "MoE with a shared expert"),
    "olmoe": (_MOE, "sdpa", "MoE"),
    "gpt_oss": (dict(_MOE, sliding_window=BIG_WINDOW), "eager", "MoE, attention sinks, sliding + full layers"),
}

# Families refused at construction: model_type -> (extra config kwargs, what the message must say).
REFUSED_FAMILIES: dict[str, tuple[dict, str]] = {
    "bloom": ({}, "ALiBi"),
    "mpt": ({}, "ALiBi"),
    "falcon": (dict(alibi=True), "ALiBi"),
    "mamba": ({}, "state-space"),
    "mamba2": (dict(num_heads=8, head_dim=16, n_groups=1), "state-space"),
    "falcon_mamba": ({}, "state-space"),
    "rwkv": ({}, "state-space"),
    "xlstm": ({}, "state-space"),
    "recurrent_gemma": ({}, "state-space"),
    "jamba": (dict(attn_layer_period=2, attn_layer_offset=1), "state-space"),
    "bamba": ({}, "state-space"),
    "falcon_h1": ({}, "state-space"),
    "granitemoehybrid": ({}, "state-space"),
    "nemotron_h": ({}, "state-space"),
    "zamba2": (dict(mamba_headdim=16, layers_block_type=["mamba", "hybrid"]), "state-space"),
    "qwen3_next": (dict(layer_types=["linear_attention", "full_attention"]), "state-space"),
    "lfm2": (dict(layer_types=["conv", "full_attention"]), "convolution"),
    "llama4_text": (dict(no_rope_layers=[1, 0], layer_types=["chunked_attention", "full_attention"]), "chunked"),
}


def _config(model_type: str, extra: dict):
    from transformers import AutoConfig

    kw = dict(_common, **extra)
    return AutoConfig.for_model(model_type, **kw)


def make_family(model_type: str, seed: int = 0):
    """A tiny fp32 model of a MORE_FAMILIES row, in eval mode."""
    from transformers import AutoModelForCausalLM

    extra, attn, _ = MORE_FAMILIES[model_type]
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(model_type, extra), attn_implementation=attn).eval()


def make_refused(name: str):
    """A tiny model of a REFUSED_FAMILIES row (eager attention: most of them have no sdpa)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_config(name, REFUSED_FAMILIES[name][0]), attn_implementation="eager")
