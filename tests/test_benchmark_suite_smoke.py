"""The benchmark suite runs every case at tiny shapes (timings are never asserted), and the official-style
reference it times computes MuToR's loss."""

from __future__ import annotations

import json
import math

import torch

from mutor.testing.official_style import interleave, official_example_loss
from scripts import run_module

CASES = ["plain", "mutor", "mutor_fixed", "multi_token", "official"]     # the suite's cases, in its order


def test_tiny_suite_has_every_case(tmp_path):
    run_module("benchmarks.suite", "--tiny", "--isolation", "inprocess", "--threads", "1", "--repeats", "1",
               "--warmup", "0", "--rounds", "2", "--loss-chunk", "16", "--json-out", tmp_path / "s.json",
               "--markdown-out", tmp_path / "s.md")
    rows = json.loads((tmp_path / "s.json").read_text())["shapes"][0]["rows"]
    assert [r["case"] for r in rows] == CASES
    for r in rows:
        assert r["ms"] > 0 and math.isfinite(r["loss"]) and r["token_ratio"] >= 1.0
    by = {r["case"]: r for r in rows}
    assert by["plain"]["extra_tokens"] == 0 and by["mutor"]["extra_tokens"] > by["mutor_fixed"]["extra_tokens"] > 0
    assert by["official"]["extra_tokens"] > 0 and by["multi_token"]["extra_tokens"] > 0
    assert "| official |" in (tmp_path / "s.md").read_text()


def test_official_style_objective_matches_mutor():
    """The reference computes MuToR's loss: same offset, same registers, same value (it is a fair baseline)."""
    from families import make_model

    from mutor import MuToRConfig, MuToRModel

    base = make_model("llama")
    ids = torch.randint(3, 61, (1, 14), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5] = -100
    model = MuToRModel(base, MuToRConfig(d_max=3, loss_weight=0.3))
    d = 2
    out = model(input_ids=ids, labels=labels, offset_index=torch.tensor([d - 1]))
    ref, n = official_example_loss(base, model.register_embeddings.weight[0], ids[0], labels[0], d, 0.3)
    assert n == out.num_registers
    # the reference interleaves a register before each of the 9 answer tokens; the last d-1 have no target
    assert sum(1 for k, _ in interleave(labels[0], d) if k == "reg") == 9 == n + d - 1
    torch.testing.assert_close(ref, out.loss, atol=1e-5, rtol=1e-5)
