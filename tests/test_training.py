"""Training behaviour: the loss weighting, gradients, optimisation, peft, checkpointing, bad input."""

from __future__ import annotations

import pytest
import torch
from families import FAMILIES, make_model, padded_batch
from peft import LoraConfig, get_peft_model
from references import TOL, kept_rows, register_refs, run_mutor
from torch import nn

from mutor import MuToRConfig, MuToRModel


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_weight_zero_is_the_plain_loss(family):
    base = make_model(family)
    batch = padded_batch()
    out = MuToRModel(base, MuToRConfig(loss_weight=0.0, seed=0))(**batch)
    ref = base(**batch, use_cache=False)
    assert out.num_registers == 0          # a=0 places no register: they would cost compute and teach nothing
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-6, rtol=1e-6)
    # with registers present (a>0), the next-token part is still exactly the plain loss
    with_regs = MuToRModel(base, MuToRConfig(loss_weight=0.5, seed=0))(**batch)
    assert with_regs.num_registers > 0
    torch.testing.assert_close(with_regs.ntp_loss, ref.loss, atol=1e-6, rtol=1e-6)


def test_loss_is_the_weighted_sum():
    out = MuToRModel(make_model("llama"), MuToRConfig(loss_weight=0.3, seed=0))(**padded_batch())
    torch.testing.assert_close(out.loss, 0.7 * out.ntp_loss + 0.3 * out.reg_loss)
    absent = out.reg_count_per_offset == 0
    assert out.reg_loss_per_offset[absent].isnan().all() and out.reg_accuracy_per_offset[absent].isnan().all()
    assert not out.reg_loss_per_offset[~absent].isnan().any()
    per = out.reg_loss_per_offset.nan_to_num(0.0) * out.reg_count_per_offset     # absent offsets: NaN, count 0
    torch.testing.assert_close(per.sum() / out.reg_count_per_offset.sum(), out.reg_loss.detach())
    assert int(out.reg_count_per_offset.sum()) == out.num_registers


@pytest.mark.parametrize("embedding", ["shared", "per_offset"])
def test_gradients_reach_register_embedding(embedding):
    model = MuToRModel(make_model("llama"), MuToRConfig(d_max=4, register_embedding=embedding, seed=0))
    out = model(**padded_batch(), offset_index=torch.tensor([1, 1, 3]))
    out.loss.backward()
    g = model.register_embeddings.weight.grad
    assert g is not None and torch.isfinite(g).all()
    used = [0] if embedding == "shared" else [1, 3]
    for row in range(g.shape[0]):
        assert (g[row].abs().sum() > 0) == (row in used)


def _train(model: MuToRModel, batch: dict, steps: int = 12, lr: float = 1e-2):
    fixed = torch.arange(batch["input_ids"].shape[0]) % len(model.mutor_config.offset_choices())

    def evaluate():
        with torch.no_grad():
            o = model(**batch, offset_index=fixed)
        return float(o.ntp_loss), float(o.reg_loss)

    before = evaluate()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
    model.eval()
    return before, evaluate()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_optimizer_steps_lower_both_losses(family):
    model = MuToRModel(make_model(family), MuToRConfig(d_max=3, loss_weight=0.5, seed=0))
    (ntp0, reg0), (ntp1, reg1) = _train(model, padded_batch())
    assert ntp1 < ntp0 - 0.1 and reg1 < reg0 - 0.1


def _lora(base):
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))


def test_lora_keeps_both_invariants():
    base = make_model("llama")
    peft_model = _lora(base)
    with torch.no_grad():  # non-trivial adapters, so the check is not a plain-model check again
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model = MuToRModel(peft_model, MuToRConfig(d_max=3, seed=0))
    batch = padded_batch()
    out = run_mutor(model, batch)
    with torch.no_grad():
        ref = peft_model(**batch, use_cache=False)
    torch.testing.assert_close(out.ntp_loss, ref.loss, **TOL)
    T = batch["input_ids"].shape[1]
    for i, (b, l) in enumerate(kept_rows(out)):
        if l < T:
            torch.testing.assert_close(out.logits[i], ref.logits[b, l], **TOL)
    n = 0
    for got, r, _ in register_refs(model, batch, out):
        torch.testing.assert_close(got, r, **TOL)
        n += 1
    assert n == out.num_registers > 0


def test_lora_trains_only_adapters_and_registers():
    model = MuToRModel(_lora(make_model("llama")), MuToRConfig(d_max=3, loss_weight=0.5, seed=0))
    model(**padded_batch()).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert "register_embeddings.weight" in with_grad
    assert all("lora_" in n or n == "register_embeddings.weight" for n in with_grad)
    assert any("lora_" in n for n in with_grad)
    (ntp0, reg0), (ntp1, reg1) = _train(model, padded_batch(), steps=15, lr=2e-2)
    assert ntp1 < ntp0 and reg1 < reg0


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("use_lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(use_lora, reentrant):
    def grads(checkpointing: bool):
        base = make_model("llama")
        if use_lora:
            base = _lora(base)
        model = MuToRModel(base, MuToRConfig(d_max=3, seed=0))
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.train()
        out = model(**padded_batch(), offset_index=torch.tensor([0, 1, 2]))
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_a, ga = grads(False)
    loss_b, gb = grads(True)
    torch.testing.assert_close(loss_a, loss_b)
    assert ga.keys() == gb.keys() and "register_embeddings.weight" in ga
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-6, rtol=1e-5, msg=n)


# ----------------------------------------------------------------------------- bad input
def test_batch_without_supervised_tokens_gives_zero_loss_and_clean_backward():
    model = MuToRModel(make_model("llama"), MuToRConfig(seed=0))
    batch = padded_batch()
    batch["labels"] = torch.full_like(batch["labels"], -100)
    out = model(**batch)
    assert float(out.loss) == 0.0 and out.num_registers == 0 and out.num_ntp_tokens == 0
    out.loss.backward()
    for p in model.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


def test_sequences_too_short_for_registers_train_on_ntp_only():
    model = MuToRModel(make_model("llama"), MuToRConfig(min_offset=3, d_max=4, loss_weight=0.3, seed=0))
    ids = torch.randint(3, 61, (2, 3))
    out = model(input_ids=ids, labels=ids)
    assert out.num_registers == 0 and float(out.reg_loss) == 0.0 and out.num_ntp_tokens == 4
    torch.testing.assert_close(out.loss, 0.7 * out.ntp_loss)
    out.loss.backward()
    assert torch.isfinite(model.base_model.lm_head.weight.grad).all()


def test_unsupported_attention_implementation_is_refused():
    base = make_model("llama")
    base.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*flash_attention_2.*sdpa"):
        MuToRModel(base, MuToRConfig())


def test_unsupported_layer_types_are_refused():
    base = make_model("llama")
    base.config.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(ValueError, match="chunked_attention"):
        MuToRModel(base, MuToRConfig())


class _NoEmbedsLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = make_model("llama").config
        self.embed = nn.Embedding(61, 64)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None):
        return self.embed(input_ids)


def test_model_without_inputs_embeds_is_refused():
    with pytest.raises(TypeError, match=r"_NoEmbedsLM.*inputs_embeds"):
        MuToRModel(_NoEmbedsLM(), MuToRConfig())


def test_non_transformers_module_is_refused():
    with pytest.raises(TypeError, match="Linear"):
        MuToRModel(nn.Linear(2, 2), MuToRConfig())


@pytest.mark.parametrize("bad, match", [
    (dict(input_ids=torch.zeros(5, dtype=torch.long)), "input_ids must be"),
    (dict(input_ids=torch.zeros(2, 5, dtype=torch.long), labels=torch.zeros(2, 4, dtype=torch.long)), "labels"),
    (dict(input_ids=torch.zeros(2, 5, dtype=torch.long), offset_index=torch.tensor([0, 9])), "offset_index"),
    (dict(input_ids=torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4)), "attention_mask"),
])
def test_bad_batches_raise_clear_errors(bad, match):
    model = MuToRModel(make_model("llama"), MuToRConfig(seed=0))
    with pytest.raises(ValueError, match=match):
        model(**bad)


def test_register_accuracy_is_top1_of_the_register_rows():
    model = MuToRModel(make_model("llama"), MuToRConfig(d_max=2, loss_weight=0.5, seed=0))
    batch = padded_batch()
    _train(model, batch, steps=40, lr=3e-2)                        # memorise the batch: accuracy well above 0
    out = run_mutor(model, batch, torch.tensor([0, 1, 1]))
    T = batch["input_ids"].shape[1]
    targets = torch.cat([out.layout.ntp_labels, out.layout.reg_labels], 1)
    rows = [(i, int(targets[b, l])) for i, (b, l) in enumerate(kept_rows(out)) if l >= T]
    hits = [float(out.logits[i].argmax() == t) for i, t in rows]
    assert 0 < sum(hits) and len(hits) == out.num_registers
    torch.testing.assert_close(out.reg_accuracy, torch.tensor(sum(hits) / len(hits)))
