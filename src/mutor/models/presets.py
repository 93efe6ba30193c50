"""Named model shapes for random-init runs: ``model.preset`` in a recipe, ``tiny_causal_lm`` in code.

A preset is ``(family, hidden, layers, heads, kv heads, intermediate)``, from CPU-sized test
models (``tiny-*``) to production shapes (``star-llama-wide``, ``llamagen-b``). The vocabulary
and the special ids come from the task, not the preset. What is unusual: input and output
embeddings are untied, a Gemma-2 preset gets ``head_dim = hidden / heads`` and eager attention
where sdpa was asked for, and ``seed`` seeds the random init right here, so two methods built
with the same seed start from the same weights.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["PRESETS", "tiny_causal_lm"]

PRESETS = {
    # family, hidden, layers, heads, kv heads, intermediate
    "tiny-llama": ("llama", 64, 2, 4, 2, 128),
    "tiny-qwen2": ("qwen2", 64, 2, 4, 2, 128),
    "tiny-gemma2": ("gemma2", 64, 2, 4, 2, 128),
    "tiny-mistral": ("mistral", 64, 2, 4, 2, 128),
    "small-llama": ("llama", 256, 4, 4, 4, 1024),
    "star-llama": ("llama", 128, 4, 4, 4, 512),       # the star-graph default: ~0.8M parameters
    "star-llama-wide": ("llama", 384, 6, 6, 6, 1536),  # a GPU-sized star-graph model
    "image-tiny": ("llama", 128, 4, 4, 4, 512),        # digits on a CPU
    "llamagen-b": ("llama", 768, 12, 12, 12, 2048),    # LlamaGen-B shape: ~111M parameters with a 16384 codebook
}


def tiny_causal_lm(vocab_size: int, preset: str = "tiny-llama", max_position_embeddings: int = 2048,
                   attn_implementation: str = "sdpa", seed: Optional[int] = None, pad_token_id: int = 0,
                   bos_token_id: Optional[int] = 1, eos_token_id: Optional[int] = 2, **overrides):
    """A random-init causal LM of a named preset (see ``PRESETS``); fp32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if preset not in PRESETS:
        from ..utils.errors import did_you_mean

        hint = did_you_mean([preset], sorted(PRESETS))
        raise ValueError(f"unknown model preset {preset!r}{' (' + hint + ')' if hint else ''}; "
                         f"known presets: {sorted(PRESETS)}")
    family, hidden, layers, heads, kv, inter = PRESETS[preset]
    kw = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=max_position_embeddings,
              pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
              tie_word_embeddings=False)
    if family == "gemma2":
        kw["head_dim"] = hidden // heads
        attn_implementation = "eager" if attn_implementation == "sdpa" else attn_implementation
    kw.update(overrides)
    cfg = AutoConfig.for_model(family, **kw)
    cfg._attn_implementation = attn_implementation
    if seed is not None:
        torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)
