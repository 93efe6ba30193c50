"""bf16 training (mutor.run.precision): float32 master weights for what the method adds, the speed paths in bf16
against their float32/bf16 references, and the fall-back to float32 where bf16 is slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from families import make_model, padded_batch

import mutor.generation as spec
import mutor.run.precision as precision
from mutor import MuToRConfig, MuToRModel
from mutor.data.collator import PaddingCollator
from mutor.methods.multi_token import MultiTokenConfig, MultiTokenModel
from mutor.models.presets import tiny_causal_lm
from mutor.run.train import run_recipe

FIXTURE = Path(__file__).resolve().parents[1] / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl"


def _batch(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p, a = 3 + i % 3, 8 + i % 4
        ids = torch.randint(3, 259, (p + a,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * p + ids[p:]})
    return PaddingCollator()(rows)


@pytest.mark.parametrize("wrap", ["mutor", "multi_token"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_added_parameters_keep_float32_master_weights_under_a_bf16_base(wrap, lora):
    """The register vector / heads are float32 next to bf16 weights, and an AdamW step far below bf16's resolution
    (1e-6 on values of order 1e-2..1) still moves them."""
    base = tiny_causal_lm(259, seed=0).to(torch.bfloat16)
    if lora:
        from peft import LoraConfig, get_peft_model

        base = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    model = MuToRModel(base, MuToRConfig(d_max=3)) if wrap == "mutor" else MultiTokenModel(base, MultiTokenConfig())
    own = [p for n, p in model.named_parameters() if not n.startswith("base_model.")]
    assert own and all(p.dtype == torch.float32 for p in own)
    before = [p.detach().clone() for p in own]
    opt = torch.optim.AdamW(own, lr=1e-6, weight_decay=0.0)
    model(**_batch()).loss.backward()
    opt.step()
    moved = [float((p.detach() - b).abs().max()) for p, b in zip(own, before) if p.grad.abs().max() > 0]
    assert moved and all(0 < m < 1e-5 for m in moved), moved     # (a LoRA A under a zero B has no gradient yet)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_ntp_loss_in_bf16_is_the_plain_bf16_forward(family):
    """Registers stay invisible to regular tokens in bf16 too: MuToR's ntp loss is the plain bf16 model's loss
    (up to bf16 rounding of the split/dense attention kernels), chunked and not."""
    base = make_model(family).to(torch.bfloat16).eval()
    batch = padded_batch()
    with torch.no_grad():
        plain = float(base(**batch).loss)
        for chunk in (None, 7):
            out = MuToRModel(base, MuToRConfig(d_max=3), loss_chunk_size=chunk)(**batch)
            assert float(out.ntp_loss) == pytest.approx(plain, rel=2e-3), chunk
            assert out.num_registers > 0


@pytest.mark.parametrize("family,window", [("llama", None), ("gemma3", 3), ("qwen3", 3)])
def test_bf16_drafting_departs_from_plain_greedy_only_at_bf16_ties(family, window):
    """In bf16, greedy decoding depends on kernel shapes (a cached one-row forward and a multi-row verification
    round differently), so drafting is lossless only up to bf16 rounding: wherever its output first differs from
    transformers' greedy decoding, the two tokens' logits under the plain model are within bf16 resolution."""
    base = make_model(family, window=window).to(torch.bfloat16).eval()
    model = MuToRModel(base, MuToRConfig(d_max=4))
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)
    same = 0
    for seed in range(1, 6):
        ids = torch.randint(3, 61, (1, 7), generator=torch.Generator().manual_seed(seed))
        got, _ = spec.generate(model, ids, max_new_tokens=24, draft_registers=4, eos_token_id=[])
        with torch.no_grad():
            ref = base.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0)
        diff = (got[0] != ref[0]).nonzero().flatten()
        if len(diff) == 0:
            same += 1
            continue
        p = int(diff[0])
        with torch.no_grad():
            logits = base(ref[:, :p]).logits[0, -1].float()                             # (V,)
        gap = abs(float(logits[got[0, p]] - logits[ref[0, p]]))
        assert gap <= 2 ** -7 * float(logits.abs().max()) * 2, (family, seed, p, gap)   # two bf16 ulps
    assert same >= 3


def test_slow_bf16_falls_back_to_float32_with_a_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(precision, "_cpu_bf16_speedup", lambda: 0.3)
    dtype, bf16, notice = precision.resolve_precision("bfloat16", False, "cpu")
    assert (dtype, bf16) == ("float32", False)
    assert "model.dtype=bfloat16 asked for, but a bf16 matrix product runs 0.30x the float32 speed" in notice
    assert precision.resolve_precision("float32", True, "cpu")[:2] == ("float32", False)
    assert precision.resolve_precision("float32", False, "cpu") == ("float32", False, None)
    out = tmp_path / "run"
    run_recipe({"method": "mutor", "model": {"preset": "tiny-llama", "tokenizer": "byte", "dtype": "bfloat16"},
                "data": {"task": "gsm8k", "path": str(FIXTURE), "limit": 8},
                "training": {"max_steps": 1, "per_device_train_batch_size": 4, "report_to": [], "use_cpu": True,
                             "save_strategy": "no", "disable_tqdm": True, "output_dir": str(out)}})
    assert "training in float32 instead" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"]["model_dtype"] == "float32" and summary["precision"]["fallback"]
    assert "bfloat16" in (out / "recipe.yaml").read_text()          # the recipe as asked, so --resume matches it


def test_bf16_autocast_recipe_trains_on_a_cpu(tmp_path, monkeypatch):
    """training.bf16: true (float32 weights, autocast; the full fine-tuning mode) runs on a CPU without the user
    having to add use_cpu, and the summary records it."""
    monkeypatch.setattr(precision, "_cpu_bf16_speedup", lambda: 4.0)
    out = tmp_path / "run"
    run_recipe({"method": "mutor", "model": {"preset": "tiny-llama", "tokenizer": "byte"},
                "data": {"task": "gsm8k", "path": str(FIXTURE), "limit": 8},
                "training": {"max_steps": 1, "per_device_train_batch_size": 4, "report_to": [], "bf16": True,
                             "save_strategy": "no", "disable_tqdm": True, "output_dir": str(out)}}, quiet=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == {"model_dtype": "float32", "bf16_autocast": True, "fallback": None}


def test_fast_bf16_keeps_what_was_asked(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_bf16_speedup", lambda: 4.0)
    assert precision.resolve_precision("bfloat16", False, "cpu") == ("bfloat16", False, None)
    assert precision.resolve_precision("float32", True, "cpu") == ("float32", True, None)
    assert precision.fast_bf16("cpu") == (True, "a bf16 matrix product runs 4.00x the float32 speed on this CPU")
