"""Smoke test of benchmarks/speculative.py on a tiny MuToR run of a text task (bidirectional prefix): every
method decodes the same tokens, prompt lookup is paired with causal greedy, and the table renders (never timings)."""

from __future__ import annotations

import json

from scripts import ROOT, run_module


def test_text_task_run_in_two_dtypes(tmp_path):
    from mutor.run.train import run_recipe

    out = tmp_path / "run"
    run_recipe("tiny/gsm8k", ["method=mutor", "seed=0", "mutor.d_max=3", "prefix_attention=bidirectional",
                              "training.max_steps=2", "training.save_steps=2", f"training.output_dir={out}"])
    data = str(ROOT / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl")
    results = tmp_path / "results.jsonl"
    shown = run_module("benchmarks.speculative", "--run", out / "checkpoint-2", "--draft", "2", "auto",
                       "--num-prompts", "2", "--max-new-tokens", "4", "--rounds", "1", "--lookup", "2",
                       "--dtype", "float32", "bfloat16", "--data", data, "--json", results).stdout
    assert shown.count("registers_Kauto") == 2                                   # a table per dtype
    lines = results.read_text().splitlines()
    assert len(lines) == 2                                                       # a row per dtype
    for line in lines:
        res = json.loads(line)
        assert res["prefix_attention"] == "bidirectional" and res["stop_at_eos"] and res["prompts"] == 2
        methods = [r["method"] for r in res["rows"]]
        assert methods == ["greedy", "greedy_causal", "prompt_lookup_2", "registers_K2", "registers_Kauto"]
        against = {r["method"]: r["against"] for r in res["rows"]}
        assert against["prompt_lookup_2"] == "greedy_causal" and against["registers_Kauto"] == "greedy"
        assert all(r["tokens_per_s"] > 0 for r in res["rows"])
        assert all(0 <= r["prompts_differing"] <= 2 for r in res["rows"])   # float32 would have raised instead
        assert res["device"] == "cpu"
    # the command line: --device places the model and the prompts, and each JSON row names where it decoded
    rows = tmp_path / "rows.jsonl"
    run_module("benchmarks.speculative", "--run", out / "checkpoint-2", "--draft", "2", "--num-prompts", "1",
               "--max-new-tokens", "3", "--rounds", "1", "--lookup", "0", "--data", data, "--device", "cpu",
               "--json", rows)
    row = json.loads(rows.read_text())
    assert row["device"] == "cpu" and [r["method"] for r in row["rows"]] == ["greedy", "registers_K2"]
