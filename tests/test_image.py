"""MuToR-2D on image tokens: grid offsets at the edges, data, guided sampling, metrics, a tiny run, `mutor sample`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mutor import MuToRConfig
from mutor.core.layout import build_layout
from mutor.image.data import ImageTokenDataset, load_codes, load_digits_split
from mutor.image.metrics import frechet_distance, precision_recall
from mutor.image.sample import sample_codes
from mutor.image.tokens import ImageLayout
from mutor.models.presets import tiny_causal_lm

LAYOUT = ImageLayout(codebook_size=8, num_classes=10, height=8, width=8, levels=8)


# ------------------------------------------------------------ 2D offsets
@pytest.mark.parametrize("choice", MuToRConfig(d_max_2d=4, grid_width=8, grid_start=1).offset_choices())
def test_2d_offsets_on_the_digit_grid(choice):
    """Registers after image token (r, c) target (r+dh-1, c+dw-1); none past the right edge or the bottom."""
    cfg = MuToRConfig(d_max_2d=4, grid_width=8, grid_start=1, loss_weight=0.5)
    assert (1, 1) not in cfg.offset_choices() and len(cfg.offset_choices()) == 15
    dh, dw = choice
    ids = torch.tensor([[8 + 3] + list(range(64))])                     # class token, then token k at grid cell k
    labels = ids.clone()
    labels[0, 0] = -100
    k = cfg.offset_choices().index(choice)
    lay = build_layout(labels, cfg, offset_index=torch.tensor([k]))
    got = {(int(s), int(t), int(p)) for s, t, p, v in zip(lay.reg_source[0], lay.reg_labels[0],
                                                            lay.position_ids[0, 65:], lay.reg_valid[0]) if v}
    d = (dh - 1) * 8 + dw - 1
    want = set()
    for cell in range(64):
        r, c = divmod(cell, 8)
        tr, tc = r + dh - 1, c + dw - 1
        if tr < 8 and tc < 8:                                              # inside the grid: a register exists
            want.add((cell + 1, tr * 8 + tc, cell + 1 + d - 1))            # source index, target code, position id
    assert got == want
    assert lay.ntp_labels[0, 0] == 0                                       # the class token predicts the first code


# ------------------------------------------------------------------ data
def test_digits_split_is_fixed_disjoint_and_quantized():
    (xtr, ytr), (xte, yte) = load_digits_split(8)
    (xtr2, _), _ = load_digits_split(8)
    assert len(xtr) + len(xte) == 1797 and np.array_equal(xtr, xtr2)
    assert xtr.min() >= 0 and xtr.max() == 7 and xtr.shape[1] == 64
    assert set(ytr.tolist()) == set(yte.tolist()) == set(range(10))
    from sklearn.datasets import load_digits

    rows = {tuple(r) for r in load_digits().data.astype(int).tolist()}
    assert len(rows) > 1700                     # the split is by example; exact duplicates are rare in digits


def test_class_dropout_is_deterministic_and_about_ten_percent():
    (x, y), _ = load_digits_split(8)
    ds = ImageTokenDataset(x, y, LAYOUT, class_dropout=0.1, seed=3)
    first = [ds[i]["input_ids"][0] for i in range(len(ds))]
    again = [ImageTokenDataset(x, y, LAYOUT, 0.1, seed=3)[i]["input_ids"][0] for i in range(len(ds))]
    assert first == again
    rate = np.mean([t == LAYOUT.null_class for t in first])
    assert 0.07 < rate < 0.13
    ds.epoch = 1
    assert [ds[i]["input_ids"][0] for i in range(len(ds))] != first      # a new epoch drops other labels
    item = ds[0]
    assert item["labels"][0] == -100 and item["labels"][1:] == x[0].tolist()
    with pytest.raises(ValueError, match="codes must lie"):
        ImageTokenDataset(x + 8, y, LAYOUT)


def test_image_codes_files(tmp_path):
    codes = np.random.default_rng(0).integers(0, 16, (20, 16))
    labels = np.arange(20) % 4
    np.savez(tmp_path / "c.npz", codes=codes, labels=labels)
    c, lab = load_codes(str(tmp_path / "c.npz"))
    assert np.array_equal(c, codes) and np.array_equal(lab, labels)
    np.save(tmp_path / "c.npy", codes)
    with pytest.raises(ValueError, match="labels_path"):
        load_codes(str(tmp_path / "c.npy"))
    from mutor.data import build_training_data

    task = build_training_data("image_codes", {"path": str(tmp_path / "c.npz"), "codebook_size": 16,
                                               "num_classes": 4, "test_fraction": 0.2}, None, 0)
    assert task.vocab_size == 21 and task.mutor_overrides == {"grid_width": 4, "grid_start": 1}
    assert task.info["num_test"] == 4 and len(task.train_dataset) == 16
    with pytest.raises(ValueError, match="needs data.codebook_size"):
        build_training_data("image_codes", {"path": str(tmp_path / "c.npz"), "num_classes": 4}, None, 0)


# -------------------------------------------------------------- sampling
def _model():
    return tiny_causal_lm(LAYOUT.vocab_size, seed=0, bos_token_id=None, eos_token_id=None,
                          pad_token_id=LAYOUT.null_class).eval()


@pytest.mark.parametrize("scale", [1.0, 2.0, 3.0])
def test_samples_are_valid_grids(scale):
    codes = sample_codes(_model(), LAYOUT, [0, 3, 9], cfg_scale=scale, top_k=4,
                         generator=torch.Generator().manual_seed(0))
    assert codes.shape == (3, 64) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < LAYOUT.codebook_size


def test_guidance_scale_one_is_plain_conditional_sampling():
    model = _model()
    a = sample_codes(model, LAYOUT, [1, 2, 2, 7], cfg_scale=1.0, generator=torch.Generator().manual_seed(5))
    b = sample_codes(model, LAYOUT, [1, 2, 2, 7], cfg_scale=1.0, generator=torch.Generator().manual_seed(5),
                     always_guide=True)                                   # u + 1*(c-u) through the guided path
    assert np.array_equal(a, b)
    c = sample_codes(model, LAYOUT, [1, 2, 2, 7], cfg_scale=3.0, generator=torch.Generator().manual_seed(5))
    assert not np.array_equal(a, c)


def test_top_k_one_is_greedy_and_cached_sampling_matches_full_forward():
    model = _model()
    codes = sample_codes(model, LAYOUT, [4], cfg_scale=1.0, top_k=1)
    seq = [LAYOUT.class_token(4)]
    with torch.no_grad():
        for _ in range(64):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1, :LAYOUT.codebook_size]
            seq.append(int(logits.argmax()))
    assert codes[0].tolist() == seq[1:]


# --------------------------------------------------------------- metrics
def test_metrics_on_known_distributions():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(400, 4))
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)
    p, r = precision_recall(a, a, k=3)
    assert p == r == 1.0
    shifted = a + np.array([2.0, 0, 0, 0])
    assert frechet_distance(a, shifted) == pytest.approx(4.0, rel=1e-6)   # same covariance: |mu_a - mu_b|^2
    far = a + 50.0
    assert precision_recall(a, far, k=3) == (0.0, 0.0)


# ---------------------------------------------------------- tiny training
def test_tiny_digits_run_lowers_bits_per_token_and_samples(tmp_path, capsys):
    from mutor.run.cli import main
    from mutor.run.train import run_recipe

    out = run_recipe("image/digits", ["training.max_steps=40", "training.eval_steps=40", "training.save_steps=40",
                                      "data.eval_samples_per_class=3", "data.cfg_scales=[1.0,2.0]",
                                      "model.preset=tiny-llama", "training.report_to=[]",
                                      f"training.output_dir={tmp_path}"], quiet=True)
    assert [r["method"] for r in out["runs"]] == ["next_token", "mutor_1d", "mutor_2d"]
    for run in out["runs"]:
        first, last = run["eval_history"][0], run["eval_history"][-1]
        assert last["eval_bits_per_token"] < first["eval_bits_per_token"]
        for k in ("eval_fd", "eval_precision", "eval_recall", "eval_class_acc_cfg1", "eval_class_acc_cfg2",
                  "eval_fd_floor"):
            assert np.isfinite(last[k])
    assert "fd" in (tmp_path / "comparison.md").read_text()
    cfg2d = json.loads((tmp_path / "mutor_2d" / "mutor_config.json").read_text())
    assert cfg2d["d_max_2d"] == 4 and cfg2d["grid_width"] == 8 and cfg2d["grid_start"] == 1
    capsys.readouterr()
    main(["compare", str(tmp_path), "--metrics", "fd", "bits_per_token", "--plot", str(tmp_path / "cmp.png")])
    table = capsys.readouterr().out
    assert "| mutor_2d |" in table and "digits fd" in table and "digits bits_per_token" in table
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    main(["sample", "--model", str(tmp_path / "mutor_2d"), "--num-per-class", "2", "--classes", "0", "5",
          "--output-dir", str(tmp_path / "s")])
    assert np.load(tmp_path / "s" / "codes.npy").shape == (4, 64)
    assert (tmp_path / "s" / "class_5.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("mode", ["1d", "2d"])
def test_paper_placement_changes_nothing_on_image_sequences(mode):
    """[class] + codes with every code supervised: registers within the answer (the paper's rule, the default)
    and the supervised-target rule place the same registers, so image results do not depend on the rule."""
    (x, y), _ = load_digits_split(8)
    ds = ImageTokenDataset(x[:16], y[:16], LAYOUT, class_dropout=0.1, seed=0)
    labels = torch.tensor([ds[i]["labels"] for i in range(16)])
    kw = dict(d_max_2d=4, grid_width=8, grid_start=1) if mode == "2d" else dict(d_max=4)
    n = len(MuToRConfig(**kw).offset_choices())
    offsets = torch.arange(16) % n
    paper, old = (build_layout(labels, MuToRConfig(**kw, loss_weight=0.5, register_placement=p), offset_index=offsets)
                  for p in ("within_answer", "supervised_target"))
    assert paper.num_registers > 0
    for name in ("position_ids", "reg_source", "reg_labels", "reg_valid"):
        assert torch.equal(getattr(paper, name), getattr(old, name)), name


def test_image_modules_import_one_way():
    """data -> metrics -> sample -> tokens: no module of mutor.image imports one that imports it back."""
    import ast
    from pathlib import Path

    import mutor.image

    root = Path(mutor.image.__file__).parent
    deps = {}
    for f in root.glob("*.py"):
        tree = ast.parse(f.read_text())
        deps[f.stem] = {n.module.lstrip(".").split(".")[0] for n in ast.walk(tree)
                        if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
    assert deps["tokens"] == set() and deps["sample"] == {"tokens"}
    assert deps["metrics"] == {"sample", "tokens"} and deps["data"] == {"metrics", "tokens"}
