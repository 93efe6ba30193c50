"""Split attention (mutor.attention) equals the dense (T+R)x(T+R) mask path: logits, losses and gradients."""

from __future__ import annotations

import pytest
import torch

from families import make_model, packed_batch, padded_batch
from mutor import MuToRConfig, MuToRModel
from mutor import attention as split_mod

SDPA_FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "mistral", "gpt2"]


def _unpadded(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 61, (3, 12), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "labels": labels}


CASES = {
    "padded": (padded_batch, MuToRConfig(d_max=3, loss_weight=0.4, seed=0)),
    "packed": (packed_batch, MuToRConfig(d_max=3, loss_weight=0.4, seed=0)),
    "unpadded-causal": (_unpadded, MuToRConfig(d_max=4, loss_weight=0.4, seed=0)),
    "bidirectional": (padded_batch, MuToRConfig(d_max=3, loss_weight=0.4, prefix_attention="bidirectional", seed=0)),
    "two-registers": (padded_batch, MuToRConfig(d_max=3, loss_weight=0.4, num_registers=2, seed=0)),
    "2d": (_unpadded, MuToRConfig(d_max_2d=2, grid_width=4, grid_start=4, loss_weight=0.5, seed=0)),
}


def _run(attention, family, batch_fn, cfg, window=None):
    torch.manual_seed(0)
    model = MuToRModel(make_model(family, window=window), cfg, attention=attention)
    out = model(**batch_fn(), return_logits=True)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", SDPA_FAMILIES)
def test_split_equals_dense(family, case):
    batch_fn, cfg = CASES[case]
    split, g_split = _run("auto", family, batch_fn, cfg)
    dense, g_dense = _run("dense", family, batch_fn, cfg)
    assert split.num_registers == dense.num_registers > 0
    torch.testing.assert_close(split.logits, dense.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split.loss, dense.loss, atol=1e-6, rtol=1e-6)
    assert g_split.keys() == g_dense.keys()
    for name in g_split:
        torch.testing.assert_close(g_split[name], g_dense[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_split_equals_dense_with_a_binding_window(family):
    cfg = MuToRConfig(d_max=3, loss_weight=0.4, seed=0)
    split, _ = _run("auto", family, padded_batch, cfg, window=3)
    dense, _ = _run("dense", family, padded_batch, cfg, window=3)
    torch.testing.assert_close(split.logits, dense.logits, atol=1e-5, rtol=1e-5)


def test_split_runs_only_inside_mutor_forward(monkeypatch):
    """The split function is used for MuToR's forward (causal fast path when possible) and never leaks out."""
    calls = []
    real = split_mod.split_sdpa_attention

    def spy(module, query, *args, **kwargs):
        state = split_mod._STATE.get()
        calls.append((query.shape[2], None if state is None else (state.num_regular, len(state.causal_masks))))
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(split_mod, "split_sdpa_attention", spy)
    from transformers import AttentionInterface

    monkeypatch.setitem(AttentionInterface._global_mapping, split_mod.SPLIT_ATTENTION, spy)
    base = make_model("llama")
    model = MuToRModel(base, MuToRConfig(d_max=2, loss_weight=0.3, seed=0))
    model(**_unpadded())
    assert calls and all(st == (12, 1) for _, st in calls)           # T=12 regular tokens, causal block detected
    assert base.config._attn_implementation == "sdpa"
    calls.clear()
    base(input_ids=_unpadded()["input_ids"])                          # the plain model: its own sdpa
    base.generate(input_ids=_unpadded()["input_ids"][:1], max_new_tokens=2, do_sample=False)
    assert calls == []


def test_bad_attention_option_is_named():
    with pytest.raises(ValueError, match="attention must be"):
        MuToRModel(make_model("llama"), attention="sparse")
