"""``python -m benchmarks.pool_drafting``: repeated drafting passes of one checkpoint pooled per decoder, with an
interval over the prompts; passes that do not pool are refused."""

from __future__ import annotations

import json

import pytest

from scripts import run_module


def _pool(rows: list[dict], tmp_path, check: bool = True):
    """``python -m benchmarks.pool_drafting`` on ``rows``, one file a pass."""
    files = []
    for i, row in enumerate(rows):
        files.append(tmp_path / f"pass{i}.json")
        files[-1].write_text(json.dumps(row))
    return run_module("benchmarks.pool_drafting", *files, check=check)


def pool(rows: list[dict], tmp_path) -> dict:
    """The pooled figures the command prints."""
    return json.loads(_pool(rows, tmp_path).stdout)["pooled"]


def refusal(rows: list[dict], tmp_path) -> str:
    """What the command says when it refuses ``rows`` (it exits non-zero)."""
    proc = _pool(rows, tmp_path, check=False)
    assert proc.returncode != 0
    return proc.stderr


def _row(greedy, auto, ckpt="ck", ratio=None):
    return {"checkpoint": ckpt, "prompts": len(greedy), "greedy": {"per_prompt_seconds": greedy},
            "drafting": {"K=auto": {"per_prompt_seconds": auto, "speedup_vs_greedy": ratio or sum(greedy) / sum(auto)}}}


def test_pool_sums_every_pass_before_dividing_and_the_interval_holds_the_pooled_ratio(tmp_path):
    rows = [_row([1.0, 2.0, 1.0], [1.0, 1.0, 1.0]), _row([1.0, 1.0, 1.0], [2.0, 1.0, 1.0])]
    got = pool(rows, tmp_path)["K=auto"]
    assert got["speedup_vs_greedy"] == pytest.approx(7 / 7)
    assert got["ci95"][0] <= 1.0 <= got["ci95"][1] and got["per_pass"] == [4 / 3, 3 / 4]


def test_pool_of_identical_prompts_has_a_point_interval(tmp_path):
    assert pool([_row([2.0] * 4, [1.0] * 4)] * 3, tmp_path)["K=auto"]["ci95"] == [2.0, 2.0]


def test_pool_refuses_passes_of_another_checkpoint_or_without_per_prompt_seconds(tmp_path):
    said = refusal([_row([1.0], [1.0]), _row([1.0], [1.0], ckpt="other")], tmp_path)
    assert "does not pool" in said and "Traceback" not in said
    old = _row([1.0], [1.0])
    del old["greedy"]["per_prompt_seconds"]
    assert "per-prompt seconds" in refusal([_row([1.0], [1.0]), old], tmp_path)
