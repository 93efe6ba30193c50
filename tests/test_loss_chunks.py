"""Chunked linear cross-entropy (MuToRModel(loss_chunk_size=...)) equals the model's own output path."""

from __future__ import annotations

import pytest
import torch
from families import make_model, packed_batch, padded_batch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mutor import MuToRConfig, MuToRModel
from mutor.core.loss import fused_linear_cross_entropy


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


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_fused_in_bfloat16_follows_the_fp32_reference(softcap):
    """The low-precision path (bf16 projection, fp32 softmax, bf16 gradient products) in its reused buffers."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(37, 16, generator=g).bfloat16().requires_grad_()
    w = torch.randn(50, 16, generator=g).bfloat16().requires_grad_()
    b = torch.randn(50, generator=g).bfloat16().requires_grad_()
    tgt = torch.randint(0, 50, (37,), generator=g)
    rw = torch.rand(37, generator=g)
    loss, ce, _ = fused_linear_cross_entropy(h, w, b, tgt, rw, softcap, chunk=8)
    loss.backward()
    assert h.grad.dtype == w.grad.dtype == b.grad.dtype == torch.bfloat16
    h2, w2, b2 = (t.detach().float().requires_grad_() for t in (h, w, b))
    z = h2 @ w2.t() + b2
    ref_ce = torch.nn.functional.cross_entropy(torch.tanh(z / softcap) * softcap if softcap else z, tgt,
                                               reduction="none")
    (ref_ce * rw).sum().backward()
    torch.testing.assert_close(ce, ref_ce.detach(), atol=5e-2, rtol=2e-2)
    for a, r in ((h.grad, h2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        torch.testing.assert_close(a.float(), r, atol=2e-2, rtol=2e-2)


class _OpSpy(TorchDispatchMode):
    """Records every aten op run under it: its name, the shapes of its outputs, and the shapes of the new
    tensors it allocates (outputs that are views of or written into an input, e.g. ``detach``, ``t`` or
    ``out=``, are not new)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]], list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.ops.append((func.overloadpacket.__name__, [tuple(t.shape) for t in outs],
                         [tuple(t.shape) for t in outs if t.untyped_storage().data_ptr() not in inputs]))
        return out

    def matmul_shapes(self) -> list[tuple[int, ...]]:
        return [shapes[0] for name, shapes, _ in self.ops if name in ("mm", "addmm", "addmm_", "matmul", "bmm")]

    def all_shapes(self) -> set[tuple[int, ...]]:
        """Shapes of every tensor allocated under the spy."""
        return {sh for _, _, new in self.ops for sh in new}


def _loss_inputs(trainable: set[str]):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(37, 16, generator=g).requires_grad_("h" in trainable)
    w = torch.randn(50, 16, generator=g).requires_grad_("w" in trainable)
    b = torch.randn(50, generator=g).requires_grad_("b" in trainable)
    tgt = torch.randint(0, 50, (37,), generator=g)
    rw = torch.rand(37, generator=g)
    return h, w, b, tgt, rw


def test_no_grad_computes_no_gradient():
    h, w, b, tgt, rw = _loss_inputs({"h", "w", "b"})
    ref = fused_linear_cross_entropy(h, w, b, tgt, rw, 3.0, chunk=8)
    spy = _OpSpy()
    with torch.no_grad(), spy:
        loss, ce, hit = fused_linear_cross_entropy(h, w, b, tgt, rw, 3.0, chunk=8)
    # only the projection, one (n, V) product per chunk; no (N, C), (V, C) or (V,) gradient buffer
    assert spy.matmul_shapes() == [(8, 50)] * 4 + [(5, 50)]
    assert not {(37, 16), (50, 16), (50,)} & spy.all_shapes()
    assert loss.grad_fn is None and not loss.requires_grad
    torch.testing.assert_close(loss, ref[0].detach(), rtol=0, atol=0)
    assert torch.equal(ce, ref[1]) and torch.equal(hit, ref[2])


@pytest.mark.parametrize("trainable", [{"h"}, {"h", "b"}, {"w"}, {"h", "w", "b"}],
                         ids=["frozen_head", "frozen_weight_trainable_bias", "frozen_hidden", "all"])
def test_only_needed_gradients_are_computed_and_equal_reference(trainable):
    h, w, b, tgt, rw = _loss_inputs(trainable)
    spy = _OpSpy()
    with spy:
        loss, ce, hit = fused_linear_cross_entropy(h, w, b, tgt, rw, 3.0, chunk=8)
    (2.5 * loss).backward()
    mm = spy.matmul_shapes()
    n_chunks = 5
    # per chunk: the projection (n, V), then dL/dh (n, C) only if h is trainable, dL/dW (V, C) only if W is
    assert mm.count((50, 16)) == (n_chunks if "w" in trainable else 0)
    assert len([s for s in mm if s in ((8, 16), (5, 16))]) == (n_chunks if "h" in trainable else 0)
    assert len(mm) == n_chunks * (1 + ("h" in trainable) + ("w" in trainable))
    if "w" not in trainable:
        assert (50, 16) not in spy.all_shapes()          # no fp32 (V, C) gradient buffer either
    if "h" not in trainable:
        assert (37, 16) not in spy.all_shapes()          # no (N, C) gradient buffer
    got = {k: t.grad for k, t in zip("hwb", (h, w, b))}
    h2, w2, b2 = (t.detach().clone().requires_grad_() for t in (h, w, b))
    logits = torch.tanh((h2 @ w2.t() + b2) / 3.0) * 3.0
    ref_ce = torch.nn.functional.cross_entropy(logits, tgt, reduction="none")
    (2.5 * (ref_ce * rw).sum()).backward()
    torch.testing.assert_close(loss, (ref_ce * rw).sum().detach())
    torch.testing.assert_close(ce, ref_ce.detach())
    for k, r in zip("hwb", (h2, w2, b2)):
        if k in trainable:
            torch.testing.assert_close(got[k], r.grad, atol=1e-5, rtol=1e-5, msg=lambda m: f"grad {k}: {m}")
        else:
            assert got[k] is None, k


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
        # equal_nan: an offset absent from the batch is NaN in both (MuToROutput)
        torch.testing.assert_close(getattr(a, k).detach(), getattr(b, k).detach(), atol=1e-5, rtol=1e-5, msg=k,
                                   equal_nan=True)
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


def test_lora_model_chunked_equals_unchunked_and_eval_under_no_grad():
    """Under LoRA (frozen output layer) the chunked loss gives the unchunked loss and LoRA/register gradients,
    the head gets none; under torch.no_grad the same losses come back with nothing to backpropagate."""
    from peft import LoraConfig, get_peft_model

    cfg = MuToRConfig(d_max=3, loss_weight=0.3, seed=0)
    outs, grads = [], []
    for chunk in (None, 7):
        torch.manual_seed(0)
        base = get_peft_model(make_model("llama"), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
        model = MuToRModel(base, cfg, loss_chunk_size=chunk)
        rng = model.rng_state()
        out = model(**padded_batch())
        out.loss.backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert not any("lm_head" in n for n in grads[-1])
        if chunk is not None:
            model.set_rng_state(rng)                          # the same offsets again
            with torch.no_grad():
                ev = model(**padded_batch())
            assert not ev.loss.requires_grad
            for k in ("loss", "ntp_loss", "reg_loss"):
                torch.testing.assert_close(getattr(ev, k), getattr(out, k).detach(), msg=k)
    a, b = outs
    for k in ("loss", "ntp_loss", "reg_loss", "reg_accuracy"):
        torch.testing.assert_close(getattr(a, k).detach(), getattr(b, k).detach(), atol=1e-5, rtol=1e-5, msg=k)
    assert grads[0].keys() == grads[1].keys() and any("lora" in n for n in grads[0])
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")
