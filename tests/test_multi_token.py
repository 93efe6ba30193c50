"""The Multi-Token baseline: next-token part unchanged, each head equal to an independent reference, vanilla saves."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from families import make_model, packed_batch, padded_batch
from transformers import AutoModelForCausalLM

from mutor import MuToRConfig, MuToRModel
from mutor.methods.multi_token import MultiTokenConfig, MultiTokenModel

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3"]
BATCHES = {"padded": padded_batch, "packed": packed_batch}


def plain_loss(model, batch):
    out = model(**batch, use_cache=False)
    logits = out.logits[:, :-1].float()
    tgt = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)


def head_reference(base, head, batch, k):
    """A copy of the plain model whose last layer is the head: its logits at t are head k's predictions."""
    ref = copy.deepcopy(base)
    ref.model.layers[-1] = head
    logits = ref(**batch, use_cache=False).logits.float()                             # (B, T, V)
    labels = batch["labels"]
    T = labels.shape[1]
    pos = batch.get("position_ids")
    ces = []
    for b in range(labels.shape[0]):
        for t in range(T - k):
            if labels[b, t + k] == -100:
                continue
            if "attention_mask" in batch and batch["attention_mask"][b, t] == 0:
                continue
            if pos is not None and int(pos[b, t + k]) - int(pos[b, t]) != k:      # another document
                continue
            ces.append(F.cross_entropy(logits[b, t][None], labels[b, t + k][None]))
    return torch.stack(ces)


@pytest.mark.parametrize("kind", list(BATCHES))
@pytest.mark.parametrize("family", FAMILIES)
def test_ntp_part_equals_plain_model_and_heads_equal_references(family, kind):
    base = make_model(family)
    batch = BATCHES[kind]()
    model = MultiTokenModel(base, MultiTokenConfig(d_max=3, loss_weight=0.4)).eval()
    # make the heads differ from the last layer, so the reference really tests which rows they see
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = model(**batch)
    torch.testing.assert_close(out.ntp_loss, plain_loss(base, batch), atol=1e-5, rtol=1e-5)
    per_head = [head_reference(base, head, batch, k) for k, head in enumerate(model.heads, start=2)]
    counts = [len(c) for c in per_head]
    assert out.reg_count_per_offset.tolist() == counts and out.num_registers == sum(counts)
    for i, ces in enumerate(per_head):
        torch.testing.assert_close(out.reg_loss_per_offset[i], ces.mean(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.reg_loss, torch.cat(per_head).mean(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, 0.6 * out.ntp_loss + 0.4 * out.reg_loss)
    assert model.count_reg_targets(dict(batch)).count == out.num_registers


def test_heads_start_as_copies_of_the_last_layer_and_count_parameters():
    base = make_model("llama")
    model = MultiTokenModel(base, MultiTokenConfig(d_max=4))
    last = base.model.layers[-1].state_dict()
    assert len(model.heads) == 3
    for head in model.heads:
        for k, v in head.state_dict().items():
            assert torch.equal(v, last[k]) and v.data_ptr() != last[k].data_ptr()
    one = sum(p.numel() for p in base.model.layers[-1].parameters())
    assert model.num_added_parameters() == 3 * one


def test_zero_weight_is_the_plain_loss_and_gradients_reach_heads():
    base = make_model("qwen2")
    batch = padded_batch()
    out = MultiTokenModel(base, MultiTokenConfig(d_max=2, loss_weight=0.0))(**batch)
    torch.testing.assert_close(out.loss, plain_loss(base, batch), atol=1e-5, rtol=1e-5)
    model = MultiTokenModel(base, MultiTokenConfig(d_max=2, loss_weight=0.3))
    model(**batch).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.heads.parameters())


def test_bidirectional_prefix_matches_mutor_prefix_mask():
    base = make_model("llama")
    batch = padded_batch()
    mt = MultiTokenModel(base, MultiTokenConfig(d_max=2, prefix_attention="bidirectional"))(**batch)
    mu = MuToRModel(base, MuToRConfig(loss_weight=0.0, prefix_attention="bidirectional"))(**batch)
    torch.testing.assert_close(mt.ntp_loss, mu.ntp_loss, atol=1e-6, rtol=1e-6)
    causal = MultiTokenModel(base, MultiTokenConfig(d_max=2))(**batch)
    assert not torch.allclose(mt.ntp_loss, causal.ntp_loss)          # the prefix mask really changed something


def test_save_drops_heads_and_sidecar_restores_them(tmp_path):
    base = make_model("mistral")
    model = MultiTokenModel(base, MultiTokenConfig(d_max=3, loss_weight=0.2))
    with torch.no_grad():
        model.heads[1].mlp.up_proj.weight.add_(1.0)
    model.save_pretrained(tmp_path / "ck")
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ck"))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    torch.testing.assert_close(plain(input_ids=ids).logits, base(input_ids=ids).logits)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in base.parameters())
    again = MultiTokenModel.from_pretrained(tmp_path / "ck")
    for a, b in zip(again.heads.state_dict().values(), model.heads.state_dict().values()):
        assert torch.equal(a, b)
    assert again.multi_token_config == model.multi_token_config


def test_refuses_models_without_llama_layout():
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        MultiTokenModel(make_model("gpt2"))


@pytest.mark.parametrize("bad, field", [(dict(d_max=1), "d_max"), (dict(loss_weight=1.0), "loss_weight"),
                                        (dict(prefix_attention="x"), "prefix_attention")])
def test_config_errors_name_the_field(bad, field):
    with pytest.raises(ValueError, match=f"MultiTokenConfig.{field}"):
        MultiTokenConfig(**bad)


@pytest.mark.parametrize("batch_fn", [padded_batch, packed_batch], ids=["padded", "packed"])
@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen3"])
def test_chunked_loss_equals_the_heads_own_logits(family, batch_fn):
    """loss_chunk_size: the same loss, metrics and gradients as projecting every row through the head."""
    outs, grads = [], []
    for chunk in (None, 5):
        torch.manual_seed(0)
        model = MultiTokenModel(make_model(family), MultiTokenConfig(d_max=3, loss_weight=0.3), loss_chunk_size=chunk)
        out = model(**batch_fn())
        out.loss.backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    a, b = outs
    assert a.num_registers == b.num_registers > 0 and a.num_ntp_tokens == b.num_ntp_tokens
    for k in ("loss", "ntp_loss", "reg_loss", "reg_accuracy", "reg_loss_per_offset", "reg_accuracy_per_offset",
              "reg_count_per_offset"):
        # equal_nan: a head without targets in the batch is NaN in both (MuToROutput)
        torch.testing.assert_close(getattr(a, k).detach(), getattr(b, k).detach(), atol=1e-5, rtol=1e-5, msg=k,
                                   equal_nan=True)
    assert grads[0].keys() == grads[1].keys() and any(n.startswith("heads.") for n in grads[0])
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")
    with pytest.raises(ValueError, match="loss_chunk_size"):
        MultiTokenModel(make_model(family), loss_chunk_size=0)


def test_from_pretrained_takes_loss_chunk_size_and_loads_a_peft_adapter(tmp_path):
    """Multi-Token's from_pretrained matches MuToR's: constructor options pass through, LoRA runs load."""
    peft = pytest.importorskip("peft")
    base = make_model("llama")
    base.save_pretrained(tmp_path / "base")                         # a local base the adapter records
    from transformers import AutoModelForCausalLM

    lora = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")),
                               peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model = MultiTokenModel(lora, MultiTokenConfig(d_max=2))
    with torch.no_grad():
        model.heads[0].mlp.up_proj.weight.add_(0.5)
    model.save_pretrained(tmp_path / "ck")
    again = MultiTokenModel.from_pretrained(tmp_path / "ck", loss_chunk_size=7)
    assert again.loss_chunk_size == 7
    assert any("lora_" in n for n, _ in again.base_model.named_parameters())
    for a, b in zip(again.heads.state_dict().values(), model.heads.state_dict().values()):
        assert torch.equal(a, b)
    batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "labels": torch.tensor([[-100, 6, 7, 8, 9]])}
    model.eval(), again.eval()
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).loss, model(**batch).loss)
