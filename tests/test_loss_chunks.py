"""Chunked linear cross-entropy (MuToRModel(loss_chunk_size=...)) equals the model's own output path."""

from __future__ import annotations

import pytest
import torch

from families import make_model, packed_batch, padded_batch
from mutor import MuToRConfig, MuToRModel
from mutor.loss import fused_linear_cross_entropy


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_equals_reference_loss_and_gradients(softcap, bias):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True) if bias else None
    tgt = torch.randint(0, 50, (37,), generator=g)
    rw = torch.rand(37, generator=g)
    loss, ce, hit = fused_linear_cross_entropy(h, w, b, tgt, rw, softcap, chunk=8)
    (2.5 * loss).backward()
    got = [h.grad.clone(), w.grad.clone()] + ([b.grad.clone()] if bias else [])
    for t in [h, w] + ([b] if bias else []):
        t.grad = None
    z = h @ w.t() + (b if bias else 0)
    logits = torch.tanh(z / softcap) * softcap if softcap else z
    ref_ce = torch.nn.functional.cross_entropy(logits, tgt, reduction="none")
    (2.5 * (ref_ce * rw).sum()).backward()
    torch.testing.assert_close(ce, ref_ce.detach())
    torch.testing.assert_close(loss, (ref_ce * rw).sum().detach())
    assert torch.equal(hit, logits.gather(1, tgt[:, None]).squeeze(1) >= logits.amax(-1))
    for a, r in zip(got, [h.grad, w.grad] + ([b.grad] if bias else [])):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch_fn", [padded_batch, packed_batch], ids=["padded", "packed"])
@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen3", "gpt2"])
def test_chunked_model_loss_equals_unchunked(family, batch_fn):
    cfg = MuToRConfig(d_max=3, loss_weight=0.3, seed=0)
    outs, grads = [], []
    for chunk in (None, 7):
        torch.manual_seed(0)
        model = MuToRModel(make_model(family), cfg, loss_chunk_size=chunk)
        out = model(**batch_fn())
        out.loss.backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    a, b = outs
    for k in ("loss", "ntp_loss", "reg_loss", "reg_accuracy", "reg_loss_per_offset", "reg_accuracy_per_offset"):
        torch.testing.assert_close(getattr(a, k).detach(), getattr(b, k).detach(), atol=1e-5, rtol=1e-5, msg=k)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")


def test_refuses_bad_chunk_and_lora_head():
    with pytest.raises(ValueError, match="loss_chunk_size"):
        MuToRModel(make_model("llama"), loss_chunk_size=0)
    from peft import LoraConfig, get_peft_model

    base = get_peft_model(make_model("llama"), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    with pytest.raises(ValueError, match="nn.Linear output layer"):
        MuToRModel(base, loss_chunk_size=8)
