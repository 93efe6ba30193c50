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


# ------------------------------------------------------------------ like with like
def _text_training_summary(run: Path, method: str, objective: float, ntp: float, seed: int = 0) -> Path:
    """A `mutor train` summary of a task without a metric of its own: its final held-out evaluation records the
    method's objective (`eval_loss`) beside the next-token loss every method measures alike (`eval_ntp_loss`)."""
    run.mkdir(parents=True, exist_ok=True)
    final = {"eval_step": 20, "eval_loss": objective, "eval_ntp_loss": ntp, "eval_runtime": 0.5}
    if method != "next_token":
        final["eval_reg_loss"] = (objective - 0.7 * ntp) / 0.3
    f = run / "summary.json"
    f.write_text(json.dumps({"method": method, "seed": seed, "task": "prompt_completion", "recipe": "pc",
                             "finished": True, "primary_metric": None, "global_step": 20, "train_loss": 4.8,
                             "wall_seconds": 1.0, "eval_history": [final]}))
    return f


def test_training_summaries_are_compared_on_the_held_out_next_token_loss(tmp_path, capsys):
    """MuToR's objective (4.309) is above next-token's (4.286) while its next-token loss (4.277) is below: the table
    compares the next-token loss, names it, and the difference keeps its digits (-0.009, not -0.0)."""
    _text_training_summary(tmp_path / "mutor", "mutor", 4.309, 4.277)
    _text_training_summary(tmp_path / "next_token", "next_token", 4.286, 4.286)
    assert main(["compare", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[:2] == ["| method | prompt_completion ntp_loss |", "|---|---|"]
    assert _row(table, "mutor") == "| mutor | 4.277 |" and _row(table, "next_token") == "| next_token | 4.286 |"
    assert "4.309" not in table                                             # the objective is never compared
    assert "prompt_completion ntp_loss: held-out next-token loss" in table and "lower is better" in table
    assert "- mutor minus next_token, prompt_completion ntp_loss: -0.0090 [no interval] (1 seed paired): " \
        "exploratory (1 seed)" in table


def test_mutor_train_table_leads_with_the_next_token_loss_and_names_the_objective(tmp_path):
    runs = [json.loads(_text_training_summary(tmp_path / m, m, obj, ntp).read_text())
            for m, obj, ntp in (("next_token", 4.286, 4.286), ("mutor", 4.309, 4.277))]
    header = comparison_markdown(runs).splitlines()[2]
    assert header.startswith("| method | steps | ntp_loss | loss (own objective) |"), header


@pytest.mark.parametrize("final, expected", [
    ({"eval_loss": 4.3}, "records neither its task's metric nor the next-token loss"),   # nothing comparable
    ({"eval_loss": 4.3, "eval_ntp_loss": 4.2}, None),                                   # the next-token loss
])
def test_a_training_summary_without_a_comparable_quantity_is_refused(tmp_path, capsys, final, expected):
    run = tmp_path / "mutor"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"method": "mutor", "seed": 0, "task": "prompt_completion",
                                                  "finished": True, "primary_metric": None,
                                                  "eval_history": [{"eval_step": 2, **final}]}))
    status = main(["compare", str(tmp_path)])
    out = capsys.readouterr()
    if expected is None:
        assert status == 0 and _row(out.out, "mutor") == "| mutor | 4.200 |"
    else:
        assert status == 2 and expected in out.err and str(run / "summary.json") in out.err
        assert "mutor eval --task prompt_completion --checkpoints" in out.err and "own objective" in out.err


def test_the_objective_asked_for_by_name_is_refused_with_the_reason(tmp_path, capsys):
    _text_training_summary(tmp_path / "mutor", "mutor", 4.309, 4.277)
    assert main(["compare", str(tmp_path), "--metrics", "loss"]) == 2
    err = capsys.readouterr().err
    assert "--metrics loss" in err and "own objective" in err and "ntp_loss" in err


@pytest.mark.parametrize("per_seed, expected", [
    ([-0.009], "-0.0090 [no interval]"),             # one seed of a loss: two significant digits of the difference
    ([0.0123], "+0.012 [no interval]"),
    ([0.0], "+0.0 [no interval]"),
    ([25.0], "+25 [no interval]"),                    # a percentage, in points
    ([0.1, 0.2, 0.3], "+0.20 [-0.05, +0.45]"),        # two significant digits of the half-width (0.248)
    ([12.5, 25.0, 37.5], "+25 [-6, +56]"),            # percentages: half-width 31 points
    ([0.004, 0.006, 0.005], "+0.0050 [+0.0025, +0.0075]"),
    ([0.3, -0.28], "+0.01 [-3.67, +3.69]"),           # a small mean in a wide interval still reads as not 0
])
def test_differences_keep_the_digits_their_size_needs(per_seed, expected):
    from mutor.eval.claims import paired
    from mutor.eval.compare import format_difference

    assert format_difference(paired(per_seed)) == expected


def test_small_loss_differences_over_seeds_keep_their_digits(tmp_path):
    """Three seeds whose next-token losses differ by 0.004 to 0.006: the mean difference and its interval are shown
    with the interval's digits (half-width 0.0025), none of them 0.0."""
    for seed, d in enumerate((0.004, 0.006, 0.005)):
        _text_training_summary(tmp_path / f"s{seed}" / "mutor", "mutor", 4.4, 4.2 + d, seed)
        _text_training_summary(tmp_path / f"s{seed}" / "next_token", "next_token", 4.2, 4.2, seed)
    table = comparison_table(collect_summaries([str(tmp_path)]))
    assert "- mutor minus next_token, prompt_completion ntp_loss: +0.0050 [+0.0025, +0.0075] (3 seeds paired): " \
        "worse than next_token" in table                            # a loss: higher is worse


def _selection(run: Path, method: str, split: str, selection_split: str, flag=None, value: float = 50.0) -> None:
    """A `mutor eval --checkpoints` summary; ``flag`` its `selected_on_reported_rows` (None: a summary without
    the field)."""
    out = run / "eval" / "chat"
    out.mkdir(parents=True, exist_ok=True)
    summary = {"task": "chat", "split": split, "model": str(run / "checkpoint-2"), "run_dir": str(run), "n": 4,
               "metrics": {"exact_match": value}, "primary": "exact_match", "method": method, "seed": 0,
               "max_new_tokens": 4, "selected_checkpoint": "checkpoint-2", "selection_split": selection_split}
    if flag is not None:
        summary["selected_on_reported_rows"] = flag
    (out / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize("split, selection_split, flag, marked", [
    ("test", "validation", False, False),           # picked on validation, reported on test
    ("validation", "validation", True, True),       # picked and reported on the same validation rows
    ("test", "validation", True, True),             # --val-data and --data the same file
    ("test", "test", None, True),                   # best test score (GSM8K), a summary without the field
    ("test", "validation", None, False),
])
def test_a_checkpoint_picked_on_the_rows_it_reports_is_marked(tmp_path, split, selection_split, flag, marked):
    _selection(tmp_path / "mutor", "mutor", split, selection_split, flag)
    _selection(tmp_path / "next_token", "next_token", "test", "validation", False, 25.0)
    table = comparison_table(collect_summaries([str(tmp_path)]))
    assert _row(table, "mutor") == "| mutor | 50.000" + (" † |" if marked else " |")
    assert _row(table, "next_token") == "| next_token | 25.000 |"
    note = f"† checkpoint selected on the rows it is reported on, so optimistic by construction: mutor on chat " \
           f"({split} rows)"
    assert (note in table) == marked, table
    diff = next(line for line in table.splitlines() if line.startswith("- mutor minus next_token"))
    assert diff.startswith("- mutor minus next_token, chat exact_match: +25 [no interval]")   # percentages: points
    assert diff.endswith("†") == marked


def test_checkpoints_picked_on_the_runs_held_out_rows_are_named_validation(tmp_path, capsys):
    """A chat run whose recipe names held-out rows (data.eval_path): `mutor eval --checkpoints` picks on them and,
    with no other test rows, reports on them: the summary names them validation and says they are the rows it was
    picked on, and `mutor compare` marks it. With --data, the pick is reported on those test rows, unmarked."""
    from mutor.run.train import run_recipe

    run = tmp_path / "chat"
    run_recipe("tiny/chat", ["method=mutor", "training.max_steps=2", "training.save_steps=1", "data.limit=16",
                             "training.per_device_train_batch_size=4", "training.report_to=[]",
                             f"training.output_dir={run}"], quiet=True)
    fast = ["--limit", "4", "--max-new-tokens", "4", "--batch-size", "4", "--quiet", "--device", "cpu"]
    assert main(["eval", "--task", "chat", "--checkpoints", str(run), *fast]) == 0
    sel = json.loads((run / "eval" / "chat" / "summary.json").read_text())
    assert sel["split"] == "validation" and sel["selection_split"] == "validation"
    assert sel["selected_on_reported_rows"] is True and "optimistic" in sel["selection"]
    assert (run / "eval" / "chat" / sel["selected_checkpoint"] / "validation" / "generations.jsonl").is_file()
    table = comparison_table(collect_summaries([str(run / "eval")]))
    assert _row(table, "mutor").endswith(" † |") and "mutor on chat (validation rows)" in table

    test_rows = Path(__file__).parents[1] / "src/mutor/configs/tiny/data/chat_tiny.jsonl"
    out = tmp_path / "on-test"
    assert main(["eval", "--task", "chat", "--checkpoints", str(run), "--data", str(test_rows),
                 "--output-dir", str(out), *fast]) == 0
    sel = json.loads((out / "summary.json").read_text())
    assert sel["split"] == "test" and sel["selection_split"] == "validation"
    assert sel["selected_on_reported_rows"] is False
    assert "†" not in comparison_table(collect_summaries([str(out)]))
    capsys.readouterr()
