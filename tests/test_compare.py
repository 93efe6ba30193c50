"""`mutor compare` reports what was measured: one row per method under the run's own name, and n = distinct runs.

The references are hand-written summaries with known numbers (so the expected means, standard
deviations and counts are computed here, independently of the library), plus one real run of a
named variant through `mutor train` and `mutor eval --task run`.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from mutor.eval.compare import collect_summaries, comparison_markdown, comparison_table
from mutor.run.cli import main
from mutor.utils.errors import MutorUserError

SG = ["data.num_train=64", "data.num_test=8", "data.path_len=4", "data.num_nodes=20", "model.preset=tiny-llama",
      "training.report_to=[]", "training.eval_steps=2", "training.max_steps=2", "training.save_steps=2"]


def _training_summary(run: Path, method: str, seed: int, solve: float) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    f = run / "summary.json"
    f.write_text(json.dumps({"method": method, "seed": seed, "task": "star_graph", "recipe": "star-graph",
                             "finished": True, "primary_metric": "solve_rate",
                             "eval_history": [{"eval_step": 2, "eval_solve_rate": solve, "eval_num_eval": 8}]}))
    return f


def _eval_summary(run: Path, method: str, seed: int, solve: float, model=None) -> Path:
    out = run / "eval" / "run-task"
    out.mkdir(parents=True, exist_ok=True)
    f = out / "summary.json"
    f.write_text(json.dumps({"task": "star_graph", "split": "test", "model": str(model or run), "n": 8,
                             "metrics": {"solve_rate": solve}, "primary": "solve_rate", "method": method,
                             "seed": seed}))
    return f


def _row(table: str, method: str) -> str:
    rows = [line for line in table.splitlines() if line.startswith(f"| {method} |")]
    assert len(rows) == 1, table
    return rows[0]


def test_a_run_with_a_training_and_an_eval_summary_counts_once(tmp_path):
    """A run's training summary and its evaluation's summary are one sample (n=1), not two."""
    _training_summary(tmp_path / "sg" / "mutor", "mutor", 0, 0.25)
    _eval_summary(tmp_path / "sg" / "mutor", "mutor", 0, 0.25)
    table = comparison_table(collect_summaries([str(tmp_path / "sg")]))
    assert _row(table, "mutor") == "| mutor | 0.250 |"                 # one sample: no ± and no n
    assert "Duplicates" in table and str(tmp_path / "sg" / "mutor" / "summary.json") in table
    # the evaluation counts (a real evaluation before training's final one)
    assert "counted once, from " + str(tmp_path / "sg" / "mutor" / "eval" / "run-task" / "summary.json") in table


def test_both_commands_read_the_same_final_evaluation(tmp_path):
    """`mutor train`'s table (per run) and `mutor compare`'s (per method) show one training summary's final
    held-out evaluation: the same value, from the same reader."""
    f = _training_summary(tmp_path / "sg" / "mutor", "mutor", 0, 0.25)
    run = {**json.loads(f.read_text()), "global_step": 2, "train_loss": 1.0, "wall_seconds": 3.0}
    md = comparison_markdown([run])
    assert "| method | steps | solve_rate | best solve_rate | train loss (own objective) | wall s |" in md
    assert "| mutor | 2 | 0.2500 | 0.2500 | 1.0000 | 3 |" in md
    table = comparison_table(collect_summaries([str(tmp_path)]))
    assert table.splitlines()[:2] == ["| method | star_graph solve_rate |", "|---|---|"]
    assert _row(table, "mutor") == "| mutor | 0.250 |"


def test_the_same_summary_twice_counts_once(tmp_path):
    f = _eval_summary(tmp_path / "a", "mutor", 0, 0.5)
    table = comparison_table(collect_summaries([str(f), str(f), str(tmp_path / "a")]))
    assert _row(table, "mutor") == "| mutor | 0.500 |"


def test_distinct_seeds_are_averaged_and_counted(tmp_path):
    vals = {0: 0.2, 1: 0.4, 2: 0.9, 3: 0.5}
    for seed, v in vals.items():
        _training_summary(tmp_path / f"seed{seed}" / "mutor", "mutor", seed, v)
        _eval_summary(tmp_path / f"seed{seed}" / "mutor", "mutor", seed, v)    # the same runs, evaluated again
        # a checkpoint's evaluation belongs to its run too
        _eval_summary(tmp_path / f"seed{seed}" / "mutor" / "checkpoint-2", "mutor", seed, v,
                      model=tmp_path / f"seed{seed}" / "mutor" / "checkpoint-2")
    table = comparison_table(collect_summaries([str(tmp_path)]))
    mean, std = statistics.fmean(vals.values()), statistics.stdev(vals.values())
    assert _row(table, "mutor") == f"| mutor | {mean:.3f} ± {std:.3f} (n=4) |"


def test_methods_are_never_merged(tmp_path):
    for name, v in (("mutor_1d", 10.0), ("mutor_2d", 20.0), ("next_token", 30.0)):
        _eval_summary(tmp_path / name, name, 0, v)
    table = comparison_table(collect_summaries([str(tmp_path)]))
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:] if line.startswith("|")] == \
        ["mutor_1d", "mutor_2d", "next_token"]


def test_unknown_metric_is_named(tmp_path, capsys):
    """`--metrics foo solve_rate` names the metric no summary has, rather than dropping it."""
    _eval_summary(tmp_path / "a", "mutor", 0, 0.5)
    with pytest.raises(MutorUserError, match=r"\['foo'\].*available: \['solve_rate'\]"):
        comparison_table(collect_summaries([str(tmp_path)]), ["foo", "solve_rate"])
    assert main(["compare", str(tmp_path), "--metrics", "foo", "solve_rate"]) == 2
    assert "foo" in capsys.readouterr().err


def test_a_variant_run_is_recorded_and_evaluated_under_its_own_name(tmp_path):
    """`mutor eval --task run` records a named variant (mutor_a) under its own name, so `mutor compare` never
    averages two different methods into one row."""
    from mutor.run.recipe import load_recipe
    from mutor.run.train import run_recipe

    out = tmp_path / "sg"
    run_recipe("star-graph", ["method=mutor_a", "variants={mutor_a: {method: mutor, mutor: {d_max: 2}}}",
                              *SG, f"training.output_dir={out}"], quiet=True)
    recorded = load_recipe(out / "recipe.yaml")
    assert recorded.methods == ["mutor_a"] and recorded.for_method("mutor_a").method_config("mutor").d_max == 2
    assert json.loads((out / "summary.json").read_text())["method"] == "mutor_a"
    assert main(["eval", "--task", "run", "--model", str(out), "--quiet", "--device", "cpu"]) == 0
    ev = json.loads((out / "eval" / "run-task" / "summary.json").read_text())
    assert ev["method"] == "mutor_a"
    table = comparison_table(collect_summaries([str(out)]))
    assert _row(table, "mutor_a") and "| mutor |" not in table and "(n=" not in table   # one run, counted once


def test_recorded_variant_recipe_names_the_variant(tmp_path):
    from mutor.eval.harness import run_info
    from mutor.run.recipe import load_recipe

    r = load_recipe("image/digits")
    for name in ("mutor_1d", "mutor_2d", "next_token"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "recipe.yaml").write_text(r.for_run(name).to_yaml())
        assert run_info(str(tmp_path / name))["method"] == name
        again = load_recipe(tmp_path / name / "recipe.yaml")
        assert again.for_method(name).to_dict() == {**r.for_method(name).to_dict(), "source_dir": again.source_dir}


def test_methods_are_compared_with_next_token_paired_by_seed_by_the_claim_rule(tmp_path):
    """Below the table, each method minus next_token over the seeds both have: the mean of the per-seed
    differences with its 95 % t-interval (here 0.1, 0.2, 0.3: mean 0.2, s.d. 0.1, 0.2 ± 4.3027 * 0.1 / sqrt(3) =
    [-0.05, +0.45]: not shown); one seed is exploratory, with the interval of two rates on its examples."""
    for seed, (m, nt) in enumerate([(0.5, 0.4), (0.6, 0.4), (0.7, 0.4)]):
        _eval_summary(tmp_path / f"s{seed}" / "mutor", "mutor", seed, m)
        _eval_summary(tmp_path / f"s{seed}" / "next_token", "next_token", seed, nt)
    _eval_summary(tmp_path / "s0" / "other", "other", 0, 0.4)
    table = comparison_table(collect_summaries([str(tmp_path)]))
    assert "- mutor minus next_token, star_graph solve_rate: +0.20 [-0.05, +0.45] (3 seeds paired): not shown" in table
    assert "- other minus next_token, star_graph solve_rate: +0.00 [" in table and "(1 seed paired, 8 examples): " \
        "exploratory (1 seed)" in table
    assert _row(table, "mutor").startswith("| mutor | 0.600 ± 0.100 |")         # the table itself is unchanged
    alone = tmp_path / "alone"
    _eval_summary(alone / "mutor", "mutor", 0, 0.5)
    assert "paired by seed" not in comparison_table(collect_summaries([str(alone)]))   # no next_token: no line
