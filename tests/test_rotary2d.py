"""2D rotary positions: the grid map, relative 2D offsets, MuToR's invariants under them, cached
sampling, and a run that saves and restores them around vanilla checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from references import TOL, register_refs, run_mutor
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from mutor import MuToRConfig, MuToRModel
from mutor.image.rotary2d import GridRotaryEmbedding, apply_saved_rotary_2d, use_rotary_2d
from mutor.image.sample import sample_codes
from mutor.image.tokens import ImageLayout
from mutor.models.presets import tiny_causal_lm

LAYOUT = ImageLayout(codebook_size=8, num_classes=10, height=4, width=4, levels=8)


def _model(rotary=True):
    m = tiny_causal_lm(LAYOUT.vocab_size, seed=0, bos_token_id=None, eos_token_id=None,
                       pad_token_id=LAYOUT.null_class).eval()
    return use_rotary_2d(m, LAYOUT.width, 1) if rotary else m


def test_position_ids_map_to_grid_cells():
    rot = GridRotaryEmbedding(head_dim=8, width=3, grid_start=1)
    row, col = rot.cells(torch.arange(8)[None])
    assert row.tolist() == [[-1, 0, 0, 0, 1, 1, 1, 2]]                  # position 0: the class token
    assert col.tolist() == [[-1, 0, 1, 2, 0, 1, 2, 0]]
    with pytest.raises(ValueError, match="divisible by 4"):
        GridRotaryEmbedding(head_dim=6, width=3)


def _score(rot, q, k, pq, pk):
    cos, sin = rot(q, torch.tensor([[pq, pk]]))                             # (1, 2, D)
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)                           # (1, 1, 2, D)
    return float((qr[0, 0, 0] * kr[0, 0, 1]).sum())


def test_attention_scores_depend_on_the_2d_offset_only():
    W = 5
    rot = GridRotaryEmbedding(head_dim=16, width=W, grid_start=1)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 2, 16, generator=g), torch.randn(1, 1, 2, 16, generator=g)
    flat = lambda r, c: 1 + r * W + c                                      # noqa: E731
    # the same (dr, dc) = (1, -2) anywhere on the grid gives the same score
    a = _score(rot, q, k, flat(1, 3), flat(2, 1))
    b = _score(rot, q, k, flat(2, 4), flat(3, 2))
    assert a == pytest.approx(b, rel=1e-5, abs=1e-5)
    # the same flat distance across a row break is a different 2D offset, hence a different score
    c = _score(rot, q, k, flat(0, 0), flat(0, 3))                          # (0, 3)
    d = _score(rot, q, k, flat(0, 4), flat(1, 2))                          # (1, -2), also 3 apart in raster order
    assert abs(c - d) > 1e-3


def _batch():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 8, (3, 16), generator=g)                      # (B, H*W)
    cls = torch.tensor([[LAYOUT.class_token(c)] for c in (0, 4, 9)])
    ids = torch.cat([cls, codes], 1)                                        # (B, 1+H*W)
    labels = ids.clone()
    labels[:, 0] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@pytest.mark.parametrize("cfg", [MuToRConfig(d_max_2d=3, grid_width=4, grid_start=1, seed=2),
                                 MuToRConfig(d_max=3, seed=2)], ids=["2d-offsets", "1d-offsets"])
def test_mutor_invariants_hold_under_2d_rotary(cfg):
    base = _model()
    model = MuToRModel(base, cfg)
    batch = _batch()
    out = run_mutor(model, batch, torch.tensor([0, 1, 2]))
    with torch.no_grad():
        ref = base(**batch, use_cache=False)
    torch.testing.assert_close(out.ntp_loss, ref.loss, **TOL)              # regular tokens never see registers
    checked = 0
    for got, want, _ in register_refs(model, batch, out):                  # each register = its own reference
        torch.testing.assert_close(got, want, **TOL)
        checked += 1
    assert checked == out.num_registers > 0
    # and the positions did change: a 1D-RoPE model with the same weights gives other logits
    with torch.no_grad():
        plain = _model(rotary=False)(**batch, use_cache=False)
    assert not torch.allclose(plain.logits, ref.logits, atol=1e-3)


def test_cached_sampling_matches_full_forward_under_2d_rotary():
    model = _model()
    codes = sample_codes(model, LAYOUT, [6], cfg_scale=1.0, top_k=1)
    seq = [LAYOUT.class_token(6)]
    with torch.no_grad():
        for _ in range(LAYOUT.num_tokens):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1, :LAYOUT.codebook_size].argmax()))
    assert codes[0].tolist() == seq[1:]


def test_rotary_2d_run_saves_vanilla_checkpoints_and_restores_the_grid(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from mutor.run.train import run_recipe

    out = run_recipe("image/digits", ["method=mutor_2d", "model.rotary_2d=true", "model.preset=tiny-llama",
                                      "training.max_steps=4", "training.eval_steps=4", "training.save_steps=4",
                                      "data.eval_samples_per_class=0", "training.report_to=[]",
                                      f"training.output_dir={tmp_path}"], quiet=True)
    assert [r["method"] for r in out["runs"]] == ["mutor_2d"]
    info = json.loads(next(tmp_path.rglob("task_info.json")).read_text())
    assert info["rotary_2d"] == {"width": 8, "grid_start": 1}
    saved = next(tmp_path.rglob("model.safetensors")).parent
    cfg = json.loads((saved / "config.json").read_text())
    assert cfg["model_type"] == "llama"                                    # a vanilla checkpoint
    model = AutoModelForCausalLM.from_pretrained(str(saved))
    assert apply_saved_rotary_2d(model, saved) == {"width": 8, "grid_start": 1}
    assert isinstance(model.model.rotary_emb, GridRotaryEmbedding)
    # `mutor sample` puts the grid back too (the model it samples from has the 2D rotary)
    import mutor.image.sample as sample_mod
    from mutor.run.cli import main

    seen = []

    def spy(model, *args, **kwargs):
        seen.append(type(model.model.rotary_emb))
        return real(model, *args, **kwargs)

    real = sample_mod.sample_codes
    monkeypatch.setattr(sample_mod, "sample_codes", spy)
    main(["sample", "--model", str(saved), "--num-per-class", "1", "--classes", "3", "--output-dir",
          str(tmp_path / "s")])
    assert seen == [GridRotaryEmbedding] and np.load(tmp_path / "s" / "codes.npy").shape == (1, 64)


def test_rotary_2d_needs_an_image_task():
    from mutor.run.train import run_recipe

    with pytest.raises(ValueError, match="rotary_2d needs an image task"):
        run_recipe("tiny/gsm8k", ["model.rotary_2d=true", "training.max_steps=1"], quiet=True)
