"""Smoke test of the benchmarks at tiny sizes (``benchmarks.step_time``, ``precision``, ``policy_overhead``,
``head_product``), each run as a user runs it: they run and report sane figures (never timings)."""

from __future__ import annotations

import json
import math

from scripts import run_module

NUMBERS = ("token_ratio", "plain_ms", "mutor_ms", "time_ratio", "time_over_token_ratio",
           "plain_cpu_ms", "mutor_cpu_ms", "plain_saved_mb", "mutor_saved_mb")


def _run(module: str, *argv: str) -> str:
    """``python -m <module> <argv>`` from the repository root; its stdout."""
    return run_module(module, *argv).stdout


def _table_rows(text: str) -> list[list[str]]:
    lines = text[text.index("| answer length | MuToR attention | regular tokens |"):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_tiny_in_process(tmp_path):
    out_json = tmp_path / "bench.json"
    text = _run("benchmarks.step_time", "--tiny", "--isolation", "inprocess", "--threads", "1", "--attention", "both",
                "--json-out", str(out_json))
    saved = json.loads(out_json.read_text())
    args, rows = saved["args"], saved["rows"]

    lengths = [a for a in args["answer_lengths"] for _ in ("split", "dense")]
    assert [r["answer_length"] for r in rows] == lengths
    assert [r["attention"] for r in rows] == ["split", "dense"] * len(args["answer_lengths"])
    table = _table_rows(text)
    assert [int(r[0]) for r in table] == lengths
    for cells in table:
        assert len(cells) == 12
        assert cells.pop(1) in ("split", "dense")
        values = [float(c.split()[0]) for c in cells]        # a trailing ✗ marks a missed target
        assert all(math.isfinite(v) and v > 0 for v in values[:8])    # counts, ratios and times
        # in-process, a later case can reuse heap freed by an earlier one, so its RSS growth may read 0
        assert all(math.isfinite(v) and v >= 0 for v in values[8:10])
        assert math.isfinite(values[10]) or values[8] == 0

    B, P = args["batch_size"], args["prompt_length"]
    for r in rows:
        A = r["answer_length"]
        assert r["regular_tokens"] == B * (P + A)
        assert 0 < r["registers"] <= B * A                   # at most one register per answer token
        assert r["token_ratio"] == (r["regular_tokens"] + r["registers"]) / r["regular_tokens"]
        for k in NUMBERS:
            assert math.isfinite(r[k]) and r[k] > 0, k
        assert math.isfinite(r["plain"]["loss"]) and math.isfinite(r["mutor"]["loss"])
    assert saved["environment"]["torch"]


def test_worker_subprocess_case(tmp_path):
    """The default isolation: each case in a fresh interpreter, its figures sent back as JSON."""
    out_json = tmp_path / "bench.json"
    _run("benchmarks.step_time", "--tiny", "--answer-lengths", "8", "--threads", "1", "--json-out", str(out_json))
    saved = json.loads(out_json.read_text())
    args, (row,) = saved["args"], saved["rows"]
    assert args["isolation"] == "subprocess"
    res = row["mutor"]
    assert res["case"] == "mutor" and res["threads"] == 1
    assert res["registers"] > 0 and res["regular_tokens"] == args["batch_size"] * (args["prompt_length"] + 8)
    for k in ("median_ms", "cpu_median_ms", "peak_mb", "saved_mb", "loss"):
        assert math.isfinite(res[k]), k
    assert res["median_ms"] > 0 and res["peak_mb"] > 0 and res["saved_mb"] > 0


def test_precision_benchmark_runs_every_case_on_a_tiny_recipe(tmp_path):
    """benchmarks/precision.py: every precision x method case trains a step and is recorded (no timing asserted);
    the first losses of one method agree across precisions to bf16 rounding."""
    precisions, methods = ("fp32", "bf16", "autocast", "bf16+autocast"), ("next_token", "mutor", "multi_token")
    out = tmp_path / "p.json"
    _run("benchmarks.precision", "--recipe", "tiny/gsm8k", "--steps", "1", "--warmup", "0", "--threads", "1",
         "--json-out", str(out), "--in-process")
    rows = json.loads(out.read_text())["rows"]
    assert {(r["precision"], r["method"]) for r in rows} == {(p, m) for p in precisions for m in methods}
    for m in methods:
        losses = [r["first_loss"] for r in rows if r["method"] == m]
        assert all(math.isfinite(x) for x in losses) and max(losses) - min(losses) < 0.05 * min(losses)


def test_policy_overhead_times_rounds_of_the_policy():
    """benchmarks/policy_overhead.py: a policy told a run's costs plans rounds, and their time is reported."""
    row = json.loads(_run("benchmarks.policy_overhead", "--rounds", "5", "--k-max", "3"))
    assert row["k_max"] == 3 and row["rounds"] == 5 and row["ms_per_round"] > 0


def test_head_product_times_each_row_count_through_both_heads(tmp_path):
    """benchmarks/head_product.py on a saved tiny model: every row count (and the prompt, 0) timed through the
    model's own head and through the float32 head product, which drafting uses in float32 on a CPU."""
    from families import make_model

    make_model("llama").save_pretrained(tmp_path / "tiny")
    _run("benchmarks.head_product", "--model", str(tmp_path / "tiny"), "--max-rows", "3", "--rounds", "2",
         "--reps", "1", "--prompt-len", "8", "--json-out", str(tmp_path / "out.json"))
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["drafting_uses"] == "product up to 8 rows, own beyond"
    assert [r["rows"] for r in out["rows"]] == [0, 1, 2, 3]
    assert all(r["own_ms"] > 0 and r["product_ms"] > 0 for r in out["rows"])
