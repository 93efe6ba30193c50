"""The loss-weight trade-off table (tradeoff.py) on hand-made rows: each weight paired with next-token of the same
seed, its latest drafting rows' K=1, best fixed K and ``auto`` as geometric means, validation at the selected
checkpoint, the plan's pick of the best weight on validation, and the figure and the marked block written."""

from __future__ import annotations

import json
import math

import pytest
import tradeoff


def _row(method: str, seed: int, scores: list[int], a=None, val=0.5, group="g") -> dict:
    tag = f"a{a}" if a is not None else ""
    return {"group": group, "run": f"{method}_s{seed}" + (f"_{tag}" if tag else ""), "method": method, "seed": seed,
            "tag": tag, "splits": {"test": {"per_example": scores}}, "selected_checkpoint": "checkpoint-2",
            "per_checkpoint": [{"checkpoint": "checkpoint-1", "accuracy": 0.0},
                               {"checkpoint": "checkpoint-2", "accuracy": val}],
            "resolved_recipe": {"mutor": {"loss_weight": a}} if a is not None else {}}


def _draft(run: str, ks: dict) -> dict:
    return {"group": "g", "run": run, "drafting": {k: {"speedup_vs_greedy": v} for k, v in ks.items()}}


ROWS = [_row("next_token", s, [1, 1, 0, 0]) for s in range(3)] + \
       [_row("mutor", s, [1, 1, 1, 0], a=0.1, val=0.6) for s in range(3)] + \
       [_row("mutor", s, [1, 0, 0, 0], a=0.3, val=0.4) for s in range(2)]
DRAFTS = [_draft("mutor_s0_a0.1", {"K=1": 0.5, "K=2": 0.5, "K=auto": 0.5}),          # measured again below
          _draft("mutor_s0_a0.1", {"K=1": 1.0, "K=2": 1.1, "K=3": 1.2, "K=auto": 1.15}),
          _draft("mutor_s1_a0.1", {"K=1": 0.98, "K=2": 1.2, "K=3": 1.3, "K=auto": 1.25})]


def test_each_weight_is_paired_with_next_token_and_its_drafting_rows_summarised():
    entries = {e["weight"]: e for e in tradeoff.tradeoff(ROWS, DRAFTS, groups=("g",))}
    assert sorted(entries) == [0.1, 0.3]
    low, high = entries[0.1], entries[0.3]
    assert low["comparison"]["mean"] == pytest.approx(25.0) and low["comparison"]["seeds"] == 3
    assert high["comparison"]["mean"] == pytest.approx(-25.0) and high["comparison"]["seeds"] == 2
    assert low["best_k"] == pytest.approx(math.sqrt(1.2 * 1.3)) and low["auto"] == pytest.approx(math.sqrt(1.15 * 1.25))
    assert low["k1"] == pytest.approx(math.sqrt(0.98))
    assert low["draft_seeds"] == 2 and math.isnan(high["best_k"]) and high["draft_seeds"] == 0
    assert low["validation"] == pytest.approx(60.0) and high["validation"] == pytest.approx(40.0)
    text = tradeoff.table(list(entries.values()))
    assert "| g | - | 0.1 | 3 |" in text and "exploratory (2 seeds)" in text and "1.25x" in text


def test_the_command_writes_the_figure_and_the_marked_block(tmp_path):
    results, drafting = tmp_path / "results.jsonl", tmp_path / "drafting.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    drafting.write_text("".join(json.dumps(d) + "\n" for d in DRAFTS))
    doc = tmp_path / "page.md"
    doc.write_text(f"before\n{tradeoff.MARKS[0]}\nold\n{tradeoff.MARKS[1]}\nafter\n")
    assert tradeoff.main(["--results", str(results), "--drafting", str(drafting), "--group", "g",
                          "--plot", str(tmp_path / "t.png"), "--markdown", str(doc)]) == 0
    assert (tmp_path / "t.png").stat().st_size > 0
    page = doc.read_text()
    assert "old" not in page and "| g | - | 0.1 |" in page and page.startswith("before") and page.endswith("after\n")
    doc.write_text("no markers")
    with pytest.raises(SystemExit, match="no <!-- tradeoff:begin -->"):
        tradeoff.main(["--results", str(results), "--drafting", str(drafting), "--group", "g", "--markdown", str(doc)])


def test_a_row_without_a_resolved_recipe_takes_its_weight_from_its_override_or_its_recipe_as_trained():
    assert tradeoff.weight({"overrides": ["seed=1", "mutor.loss_weight=0.05"]}) == 0.05
    assert tradeoff.weight({"overrides": [], "recipe": "real/smollm2-135m-reasoning-gym"}) == 0.1
    pinned = {"old": ["mutor.loss_weight=0.3"]}                      # the plan's as_trained values for its group
    row = {"group": "old", "overrides": [], "recipe": "real/smollm2-135m-reasoning-gym"}
    assert tradeoff.weight(row, pinned) == 0.3 and tradeoff.weight({**row, "group": "new"}, pinned) == 0.1
    assert tradeoff.weight({**row, "group": "rg-word-reversal"}) == 0.3   # the shipped plan's
    assert tradeoff.weight({"overrides": [], "recipe": "no/such-recipe"}) is None


def test_the_best_weight_is_picked_on_validation_over_both_tasks_once_every_run_is_in_ties_to_the_larger():
    groups, weights = ("t1", "t2"), (0.1, 0.3)
    rows = [_row("mutor", s, [1], a=a, val=v, group=g) for g in groups for s in range(3)
            for a, v in ((0.1, 0.8), (0.3, 0.7 if g == "t1" else 0.9))]
    rows += [_row("next_token", s, [1], val=1.0, group=g) for g in groups for s in range(3)]    # not a candidate
    p = tradeoff.pick(rows, groups, weights)
    assert p["weight"] == 0.3 and p["means"] == {0.1: pytest.approx(80.0), 0.3: pytest.approx(80.0)}   # a tie
    assert "**a = 0.3**" in tradeoff.pick_line(p)
    rows[0]["per_checkpoint"][1]["accuracy"] = 0.86                 # t1, seed 0, a = 0.1: now ahead
    assert tradeoff.pick(rows, groups, weights)["weight"] == 0.1
    partial = tradeoff.pick(rows[1:], groups, weights)              # a = 0.1 has 5 of its 6 runs
    assert partial["weight"] is None and partial["runs"] == {0.1: 5, 0.3: 6}
    assert "undecided until each weight has 6 runs" in tradeoff.pick_line(partial)


def test_the_margin_behind_the_pick_is_counted_in_validation_items_per_task_and_over_both():
    groups, weights = ("t1", "t2"), (0.1, 0.3)
    rows = [dict(_row("mutor", s, [1], a=a, val=v, group=g), overrides=["data.num_validation=50"])
            for g in groups for s in range(3) for a, v in ((0.1, 0.8), (0.3, 0.7 if g == "t1" else 0.9))]
    rows[0]["per_checkpoint"][1]["accuracy"] = 0.86                 # t1, seed 0, a = 0.1: 43 of 50
    m = tradeoff.margin(rows, groups, weights)
    assert m["right"] == {"t1": {0.1: 123, 0.3: 105}, "t2": {0.1: 120, 0.3: 135}}
    assert m["of"]["t1"] == {0.1: 150, 0.3: 150}
    line = tradeoff.margin_line(rows, tradeoff.pick(rows, groups, weights), groups)
    assert "t1: a = 0.1: 123, a = 0.3: 105 of 150" in line and "over both: a = 0.1: 243, a = 0.3: 240 of 300" in line
    assert line.endswith("The pick leads a = 0.3, the next, by 3 items of 300.")


def test_the_weights_are_paired_against_each_other_by_seed_and_read_by_the_claim_rule():
    pairs = tradeoff.between(ROWS, groups=("g",))
    (pair,) = pairs                                                  # a = 0.1 against a = 0.3, seeds 0 and 1
    assert (pair["a"], pair["b"], pair["seeds"]) == (0.1, 0.3, 2)
    assert pair["interval"].mean == pytest.approx(50.0) and pair["reading"] == "exploratory (2 seeds)"
    assert "| g | - | 0.1 − 0.3 | 2 | +50" in tradeoff.between_table(pairs)
