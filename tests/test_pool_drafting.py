"""benchmarks/pool_drafting.py: repeated drafting passes of one checkpoint pooled per decoder, with an interval
over the prompts; passes that do not pool are refused."""

from __future__ import annotations

import pytest

from benchmarks.pool_drafting import pool


def _row(greedy, auto, ckpt="ck", ratio=None):
    return {"checkpoint": ckpt, "prompts": len(greedy), "greedy": {"per_prompt_seconds": greedy},
            "drafting": {"K=auto": {"per_prompt_seconds": auto, "speedup_vs_greedy": ratio or sum(greedy) / sum(auto)}}}


def test_pool_sums_every_pass_before_dividing_and_the_interval_holds_the_pooled_ratio():
    rows = [_row([1.0, 2.0, 1.0], [1.0, 1.0, 1.0]), _row([1.0, 1.0, 1.0], [2.0, 1.0, 1.0])]
    got = pool(rows)["K=auto"]
    assert got["speedup_vs_greedy"] == pytest.approx(7 / 7)
    assert got["ci95"][0] <= 1.0 <= got["ci95"][1] and got["per_pass"] == [4 / 3, 3 / 4]


def test_pool_of_identical_prompts_has_a_point_interval():
    assert pool([_row([2.0] * 4, [1.0] * 4)] * 3)["K=auto"]["ci95"] == [2.0, 2.0]


def test_pool_refuses_passes_of_another_checkpoint_or_without_per_prompt_seconds():
    with pytest.raises(ValueError, match="does not pool"):
        pool([_row([1.0], [1.0]), _row([1.0], [1.0], ckpt="other")])
    old = _row([1.0], [1.0])
    del old["greedy"]["per_prompt_seconds"]
    with pytest.raises(ValueError, match="per-prompt seconds"):
        pool([_row([1.0], [1.0]), old])
