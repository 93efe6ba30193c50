"""Checkpoints stay vanilla: the base model's own files, plus a sidecar for the registers."""

from __future__ import annotations

import json

import pytest
import torch
from families import make_model, padded_batch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from mutor import MuToRConfig, MuToRModel
from mutor.methods.mutor import SIDECAR_CONFIG, SIDECAR_WEIGHTS


def _trained(base, cfg=None, steps=4):
    model = MuToRModel(base, cfg or MuToRConfig(d_max=3, loss_weight=0.5, seed=0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(**padded_batch()).loss.backward()
        opt.step()
    return model.eval()


def _greedy(model, prompt):
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                              do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_save_loads_as_the_vanilla_base_model(family, tmp_path):
    model = _trained(make_model(family))
    model.save_pretrained(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert type(loaded) is type(model.base_model)
    want = {k: v.shape for k, v in model.base_model.state_dict().items()}
    assert {k: v.shape for k, v in loaded.state_dict().items()} == want
    for k, v in model.base_model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, atol=0, rtol=0)
    saved = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert not any("register" in k for k in saved)
    prompt = padded_batch()["input_ids"][:2, :5]
    assert torch.equal(_greedy(loaded, prompt), _greedy(model.base_model, prompt))
    assert torch.equal(_greedy(model, prompt), _greedy(model.base_model, prompt))


def test_from_pretrained_restores_registers_and_config(tmp_path):
    cfg = MuToRConfig(d_max=5, loss_weight=0.2, register_embedding="per_offset", seed=3)
    model = _trained(make_model("llama"), cfg)
    model.save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / SIDECAR_CONFIG).read_text()) == cfg.to_dict()
    again = MuToRModel.from_pretrained(tmp_path / "ckpt").eval()
    assert again.mutor_config == cfg
    torch.testing.assert_close(again.register_embeddings.weight, model.register_embeddings.weight, atol=0, rtol=0)
    offsets = torch.tensor([0, 2, 4])
    with torch.no_grad():
        a = model(**padded_batch(), offset_index=offsets)
        b = again(**padded_batch(), offset_index=offsets)
    torch.testing.assert_close(a.loss, b.loss)
    # the private offset generator continues where it was saved
    torch.testing.assert_close(model.rng_state(), again.rng_state())


def test_from_pretrained_takes_the_constructor_options(tmp_path):
    """`attention` and `loss_chunk_size` reach the restored model (they are not saved) and keep the loss."""
    cfg = MuToRConfig(d_max=3, loss_weight=0.4)
    model = _trained(make_model("llama"), cfg)
    model.save_pretrained(tmp_path / "ckpt")
    plain = MuToRModel.from_pretrained(tmp_path / "ckpt").eval()
    assert plain.attention == "auto" and plain.loss_chunk_size is None
    again = MuToRModel.from_pretrained(tmp_path / "ckpt", attention="dense", loss_chunk_size=7).eval()
    assert again.attention == "dense" and again.loss_chunk_size == 7
    offsets = torch.tensor([0, 2, 1])
    with torch.no_grad():
        a = plain(**padded_batch(), offset_index=offsets)
        b = again(**padded_batch(), offset_index=offsets)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="attention must be 'auto'"):
        MuToRModel.from_pretrained(tmp_path / "ckpt", attention="flash")
    with pytest.raises(ValueError, match="loss_chunk_size must be None or a positive integer"):
        MuToRModel.from_pretrained(tmp_path / "ckpt", loss_chunk_size=0)


def test_lora_checkpoint_is_a_peft_adapter(tmp_path):
    make_model("llama").save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    model = _trained(peft_model, steps=6)
    model.save_pretrained(tmp_path / "adapter")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", SIDECAR_WEIGHTS, SIDECAR_CONFIG} <= files
    assert "model.safetensors" not in files
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    prompt = padded_batch()["input_ids"][:2, :5]
    assert torch.equal(_greedy(reloaded, prompt), _greedy(model.base_model, prompt))
    again = MuToRModel.from_pretrained(tmp_path / "adapter")
    assert isinstance(again.base_model, PeftModel)
    torch.testing.assert_close(again.register_embeddings.weight, model.register_embeddings.weight)


def test_save_is_atomic(tmp_path, monkeypatch):
    model = MuToRModel(make_model("llama"), MuToRConfig(seed=0))
    dest = tmp_path / "ckpt"
    model.save_pretrained(dest)
    before = sorted(p.name for p in dest.iterdir())

    def broken(path, **kwargs):
        (path / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(model.base_model, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(dest)
    assert sorted(p.name for p in dest.iterdir()) == before          # the old checkpoint is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]          # no temporary directory left behind
    AutoModelForCausalLM.from_pretrained(dest)
    monkeypatch.undo()
    model.save_pretrained(dest)                                       # overwriting a checkpoint works
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_from_pretrained_on_a_plain_checkpoint_names_the_missing_file(tmp_path):
    make_model("llama").save_pretrained(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match=SIDECAR_CONFIG):
        MuToRModel.from_pretrained(tmp_path / "plain")
