"""Split attention (mutor.core.attention) equals the dense (T+R)x(T+R) mask path: logits, losses and gradients."""

from __future__ import annotations

import pytest
import torch
from families import make_model, packed_batch, padded_batch

from mutor import MuToRConfig, MuToRModel
from mutor.core import attention as split_mod

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_register_rows_attention_equals_softmax_over_regular_keys_and_self(dtype):
    """The CPU register-row kernel (flash over the regular keys, the diagonal term merged through the
    log-sum-exp) against a float64 softmax over [allowed regular keys; own key], outputs and all five
    input gradients; one row sees no regular key at all (an empty register slot)."""
    if split_mod._flash_cpu_ops() is None:
        pytest.skip("this torch has no CPU flash attention kernel")
    g = torch.Generator().manual_seed(0)
    B, H, D, T, R = 2, 3, 8, 7, 5
    q, k_self, v_self = (torch.randn(B, H, R, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    k, v = (torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(2))
    allowed = torch.rand(B, 1, R, T, generator=g) > 0.5
    allowed[0, 0, 1] = False
    allowed[1, 0, 3] = True
    bias = torch.zeros(B, 1, R, T, dtype=dtype).masked_fill(~allowed, float("-inf"))
    out = split_mod._RegisterRowsAttention.apply(q, k, v, k_self, v_self, bias, ~allowed.any(-1), D ** -0.5)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    got = torch.autograd.grad(out, [q, k, v, k_self, v_self], grad_out)

    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, k_self, v_self)]
    Q, K, V, KS, VS = ref_in
    scores = (Q @ K.transpose(-1, -2) * D ** -0.5).masked_fill(~allowed, float("-inf"))      # (B, H, R, T)
    self_score = (Q * KS).sum(-1, keepdim=True) * D ** -0.5                                 # (B, H, R, 1)
    p = torch.cat([scores, self_score], -1).softmax(-1)                                     # (B, H, R, T+1)
    ref = p[..., :T] @ V + p[..., T:] * VS                                                  # (B, H, R, D)
    ref_grads = torch.autograd.grad(ref, ref_in, grad_out.double())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out.double(), ref, **tol)
    for name, a, r in zip(["q", "k", "v", "k_self", "v_self"], got, ref_grads):
        torch.testing.assert_close(a.double(), r, **tol, msg=lambda m: f"grad {name}: {m}")


def test_cpu_register_rows_skip_the_register_register_block(monkeypatch):
    """Under MuToR's forward on CPU the register rows take the kernel over regular keys only (the R x R block
    is exactly diagonal), once per layer, and the result matches the generic path over all T + R keys."""
    calls = []
    real = split_mod._RegisterRowsAttention.apply

    def spy(q, k, *args):
        calls.append((q.shape[2], k.shape[2]))
        return real(q, k, *args)

    cfg = MuToRConfig(d_max=3, loss_weight=0.4, seed=0)
    monkeypatch.setattr(split_mod._RegisterRowsAttention, "apply", spy)
    fast, g_fast = _run("auto", "llama", padded_batch, cfg)
    T = padded_batch()["input_ids"].shape[1]
    layers = make_model("llama").config.num_hidden_layers
    assert len(calls) == layers                             # once per layer
    assert all(kv == T for _, kv in calls)                  # keys: the T regular tokens only
    monkeypatch.setattr(split_mod, "_flash_cpu_ops", lambda: None)   # generic path: register rows over T + R keys
    calls.clear()
    generic, g_generic = _run("auto", "llama", padded_batch, cfg)
    assert calls == []
    torch.testing.assert_close(fast.logits, generic.logits, atol=1e-5, rtol=1e-5)
    for name in g_fast:
        torch.testing.assert_close(g_fast[name], g_generic[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_split_under_cpu_bf16_autocast_equals_dense():
    """Trainer's bf16 on CPU runs the forward under autocast (bf16 projections, fp32 rotary): the split path
    must take it (it fell over in the raw CPU kernel) and agree with the dense path."""
    base = make_model("llama")
    cfg = MuToRConfig(d_max=3, seed=1)
    split, dense = MuToRModel(base, cfg), MuToRModel(base, cfg, attention="dense")
    dense.register_embeddings.load_state_dict(split.register_embeddings.state_dict())
    batch = padded_batch()
    offsets = torch.tensor([0, 1, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = split(**batch, offset_index=offsets)
        b = dense(**batch, offset_index=offsets)
        a.loss.backward()
    torch.testing.assert_close(a.loss, b.loss, atol=2e-2, rtol=2e-2)
    assert a.num_registers == b.num_registers > 0
