"""Reporting runs, for ``mutor train`` and ``mutor compare``: one reader of summaries, one table, one plot style.

Both commands start from the same record, a run's ``summary.json`` (:func:`final_eval` is the
one place that reads a training summary's final held-out evaluation), and render it two ways:

* ``mutor train`` with several methods (:func:`write_comparison`, :func:`print_comparison`):
  one row per run of this recipe (final evaluation with the primary metric first, its best value
  over the run, training loss, wall time), a :func:`verdict` against ``next_token`` (one seed:
  exploratory, with the difference's 95 % interval on the held-out examples), and the curves over
  steps; written as ``comparison.json``, ``comparison.md``, ``curves.png``.
* ``mutor compare`` (:func:`collect_summaries`, :func:`comparison_table`, :func:`comparison_plot`):
  the paper-style table, method x task. Runs that differ only in seed are averaged: each cell is
  ``mean ± std`` of the task's primary metric over seeds (sample standard deviation, n-1; the
  paper reports three seeds), with the number of seeds when it is not 3. Below it, each method
  against ``next_token`` paired by seed (:func:`paired_differences`), its numbers with the digits
  their size needs (:func:`format_difference`).

Like is compared with like: a training summary is compared on its task's metric, else on the
held-out next-token loss (:func:`comparable_metric`), never on ``loss``, each method's own
objective (:data:`OWN_OBJECTIVE`); a value whose checkpoint was selected on the rows it is
reported on is marked :data:`OPTIMISTIC_MARK` (:func:`selected_on_reported_rows`).

Every comparison stated is read by the one claim rule, :mod:`mutor.eval.claims`.

What is unusual: in ``mutor compare`` one run is one sample. A run can have several summaries
(its training summary, an evaluation of its final model, a checkpoint selection, the same file
named twice); they are recognised by the run directory they belong to, only one of them counts
(a checkpoint selection before an evaluation before the training summary's final evaluation),
and the table says which were left out, so each cell's seeds are distinct runs.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional

from ..data.text import resolve_data_path
from ..utils.errors import MutorUserError
from ..utils.io import atomic_write, write_json_atomic, write_text_atomic

__all__ = ["NEXT_TOKEN_LOSS", "OPTIMISTIC_MARK", "OWN_OBJECTIVE", "collect_summaries", "comparable_metric",
           "comparison_markdown", "comparison_plot", "comparison_table", "curves_figure", "eval_command", "final_eval",
           "format_difference", "higher_is_better", "one_per_run", "paired_differences", "print_comparison", "run_of",
           "selected_on_reported_rows", "verdict", "write_comparison"]


# ------------------------------------------------------------------ reading
def final_eval(run: dict) -> dict:
    """A training summary's last held-out evaluation, without the ``eval_`` prefix (``num_eval`` included)."""
    hist = run.get("eval_history") or []
    return {k[5:]: v for k, v in hist[-1].items() if k.startswith("eval_") and k != "eval_step"} if hist else {}


OWN_OBJECTIVE = "loss"
"""A training summary's ``eval_loss``: each method's own objective (``(1-a)·L_ntp + a·L_reg`` for MuToR, ``L_ntp``
for next-token), a different quantity for each method, so ``mutor compare`` never compares it."""

NEXT_TOKEN_LOSS = "ntp_loss"
"""The held-out next-token loss (``eval_ntp_loss``): measured the same way for every method, so it is what
training summaries are compared on when their task has no metric of its own."""


def _primary(runs: list[dict]) -> Optional[str]:
    return next((r.get("primary_metric") for r in runs if r.get("primary_metric")), None)


def comparable_metric(primary: Optional[str], metrics: dict) -> Optional[str]:
    """The metric a training summary's final held-out evaluation is compared on.

    Args:
        primary: The task's own metric (the summary's ``primary_metric``), or None.
        metrics: The final evaluation's values, without the ``eval_`` prefix.

    Returns:
        ``primary`` when the evaluation has it, else :data:`NEXT_TOKEN_LOSS` when it has that, else None (nothing
        that every method measures the same way; never :data:`OWN_OBJECTIVE`).
    """
    if primary and primary in metrics:
        return primary
    return NEXT_TOKEN_LOSS if NEXT_TOKEN_LOSS in metrics else None


def _from_training(data: dict) -> Optional[dict]:
    """A training run's ``summary.json`` as an evaluation summary: its final held-out evaluation, on the number of
    examples it records, compared on :func:`comparable_metric`, without the method's own objective."""
    if not data.get("eval_history") or "method" not in data:
        return None
    metrics = final_eval(data)
    n = metrics.pop("num_eval", None)
    metrics.pop(OWN_OBJECTIVE, None)
    return {"task": data.get("task", "?"), "split": "held-out", "model": data.get("recipe", "?"), "n": n,
            "metrics": metrics, "primary": comparable_metric(data.get("primary_metric"), metrics),
            "method": data["method"], "seed": data.get("seed"), "_training": True}


def _local_file(value, source_dir: Optional[str]) -> Optional[str]:
    """A recipe's data path as ``mutor train`` resolved it (from the working directory, else the recipe's
    directory), or None when it names no local file."""
    if not isinstance(value, str) or not value:
        return None
    path = resolve_data_path(value, source_dir)
    return path if Path(path).is_file() else None


def eval_command(task: str, data: Optional[dict] = None, source_dir: Optional[str] = None,
                 run_dir: str = "RUN_DIR") -> str:
    """The ``mutor eval`` command that scores the checkpoints of a run of ``task``.

    Where the task's evaluation reads a Hub split (which fails offline) and the recipe trained on a local file,
    the command passes that file with ``--data`` (and ``--val-data`` where checkpoints are picked on
    validation): ``data.eval_path`` when the recipe has one, else ``data.path``.

    Args:
        task: The recipe's ``data.task``.
        data: The recipe's ``data`` block (``path``, ``eval_path``).
        source_dir: The recipe's directory, where relative data paths are looked up.
        run_dir: The run directory shown in the command.

    Returns:
        One shell command line.
    """
    import shlex

    from .benchmarks import BENCHMARKS

    cmd = f"mutor eval --task {task} --checkpoints {shlex.quote(str(run_dir))}"
    bench = BENCHMARKS.get(task)
    data = data or {}
    if bench is None or bench.examples is not None or not bench.template.hub_id:
        return cmd                              # evaluated on its own data (generated, or read from the run)
    local = _local_file(data.get("eval_path"), source_dir) or _local_file(data.get("path"), source_dir)
    if local is None:
        return cmd
    cmd += f" --data {shlex.quote(local)}"
    if bench.template.selection == "validation" and bench.template.has_split("validation"):
        cmd += f" --val-data {shlex.quote(local)}"
    return cmd


def run_of(summary: dict) -> Path:
    """The run directory a summary belongs to: a training summary's own directory, an evaluation's
    ``run_dir`` (checkpoint selection) or model directory (a ``checkpoint-N`` counts as its run)."""
    if summary.get("_training"):
        return Path(summary["_dir"]).resolve()
    if summary.get("run_dir"):
        return Path(summary["run_dir"]).resolve()
    model = Path(summary.get("model", ""))
    if not model.is_absolute() and not model.exists():       # a relative path written from elsewhere, or a Hub id
        here = Path(summary["_dir"]).resolve()                 # mutor eval writes <model>/eval/<task>/summary.json
        return next((d.parent for d in here.parents if d.name == "eval"), here)
    model = model.resolve()
    return model.parent if re.fullmatch(r"checkpoint-\d+", model.name) else model


def _rank(summary: dict) -> int:
    """Which of a run's summaries counts: a checkpoint selection, then an evaluation, then training's."""
    return 0 if "selected_checkpoint" in summary else 2 if summary.get("_training") else 1


def collect_summaries(paths: list[str]) -> list[dict]:
    """Evaluation ``summary.json`` files (or training runs' ones: their final evaluation), or directories
    searched recursively for them.

    Under a checkpoint selection (a summary with ``selected_checkpoint``), only the selection counts,
    not the per-checkpoint summaries below it.
    """
    found: list[dict] = []
    seen: set = set()
    unevaluated: list[Path] = []       # training summaries without a held-out evaluation
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        for f in ([p] if p.is_file() else sorted(p.rglob("summary.json"))):
            if f.resolve() in seen:            # the same file reached twice is one summary
                continue
            seen.add(f.resolve())
            try:
                data = json.loads(f.read_text())
            except json.JSONDecodeError as err:
                raise MutorUserError(f"{f}: not valid JSON ({err})") from None
            if "task" in data and "metrics" in data and "primary" in data:
                found.append({**data, "_dir": f.parent})
            elif data.get("finished") and (conv := _from_training(data)) is not None:
                found.append({**conv, "_dir": f.parent})
            elif "method" in data and "train_loss" in data:
                unevaluated.append(f)
    selections = [s["_dir"] for s in found if "selected_checkpoint" in s]
    kept = [s for s in found if "selected_checkpoint" in s
            or not any(sel in s["_dir"].parents for sel in selections)]
    if not kept and unevaluated:
        raise MutorUserError(_training_only(unevaluated))
    if not kept:
        raise FileNotFoundError(f"no evaluation summary.json under {paths}")
    return kept


def _score_command(summary_file: Path, run_dir) -> tuple[str, str]:
    """The task of the run whose training summary is ``summary_file``, and the ``mutor eval`` command that scores
    it (:func:`eval_command`, with its recipe's data), showing ``run_dir``."""
    from ..utils.io import yaml_load

    summary = json.loads(summary_file.read_text())
    recipe_file = summary_file.parent / "recipe.yaml"
    recipe = (yaml_load(recipe_file.read_text(), str(recipe_file)) if recipe_file.is_file() else None) or {}
    task = summary.get("task") or (recipe.get("data") or {}).get("task") or "TASK"
    return task, eval_command(task, recipe.get("data"), recipe.get("source_dir"), run_dir)


def _training_only(files: list[Path]) -> str:
    """Why training summaries alone cannot be compared, and the command that scores their runs."""
    one = len(files) == 1
    task, cmd = _score_command(files[0], files[0].parent if one else "RUN_DIR")
    what = f"{files[0]} is a training summary" if one else \
        f"{files[0]} and {len(files) - 1} more are training summaries"
    run = "the run" if one else "each run"
    return (f"{what} (of `mutor train`), with no held-out evaluation to compare (task {task!r} has none during "
            f"training); score {run} with `{cmd}`, then compare what it writes: `mutor compare` on {run}'s "
            f"directory")


def _method(s: dict) -> str:
    return s.get("method") or Path(s["model"]).name


def one_per_run(summaries: list[dict]) -> tuple[list[dict], list[str]]:
    """The summaries that count (one per method, task and run) and a note for each one left out."""
    groups: dict = defaultdict(list)
    for s in summaries:
        groups[(_method(s), s["task"], run_of(s))].append(s)
    kept, notes = [], []
    for (method, task, run), group in groups.items():
        ranked = sorted(group, key=_rank)           # stable: ties keep the order they were found in
        kept.append(ranked[0])
        for s in ranked[1:]:
            notes.append(f"{method} / {task}: {Path(s['_dir']) / 'summary.json'} is another summary of run {run}; "
                         f"counted once, from {Path(ranked[0]['_dir']) / 'summary.json'}")
    order = {id(s): i for i, s in enumerate(summaries)}
    return sorted(kept, key=lambda s: order[id(s)]), notes


# ------------------------------------------------------------------- tables
def _markdown(header: list[str], rows: list[list[str]]) -> str:
    """The one Markdown table layout of both commands."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def verdict(runs: list[dict]) -> str:
    """One sentence per method against ``next_token`` on the primary metric, by the claim rule
    (:mod:`mutor.eval.claims`).

    ``mutor train`` runs each method once, on one seed, so its comparison is exploratory whatever the
    difference: the sentence says so and shows the difference with its 95 % interval on the ``num_eval``
    held-out examples (:func:`~mutor.eval.claims.unpaired_rates`; the final evaluation records rates, not the
    per-example outcomes a paired interval needs). A finding needs three seeds or more.

    Args:
        runs: Training summaries (``summary.json``) of one recipe's runs, one per method.

    Returns:
        The sentences, one a line; empty when there is no ``next_token`` run, no primary metric, or no rate
        measured on a known number of held-out examples.
    """
    from .claims import format_interval, unpaired_rates

    primary = _primary(runs)
    ref = next((r for r in runs if r["method"] == "next_token"), None)
    if primary is None or ref is None:
        return ""
    out = []
    for run in runs:
        if run is ref:
            continue
        a, b = final_eval(run), final_eval(ref)
        if primary not in a or primary not in b or not a.get("num_eval"):
            continue
        if not (0 <= a[primary] <= 1 and 0 <= b[primary] <= 1):       # the interval is that of two rates
            continue
        n = int(a["num_eval"])
        iv = unpaired_rates(a[primary], b[primary], n)
        shown = f"{format_interval(iv)} (95 % interval on {n} held-out examples)"
        if iv.excludes_zero:
            who = run["method"] if iv.mean > 0 else "next_token"
            what = f"{who} is higher in this run"
        else:
            what = "within noise"
        out.append(f"{run['method']} minus next_token {primary}: {shown}: {what}. One seed ({run.get('seed')}): "
                   f"exploratory, not a finding; a claim needs three seeds or more whose 95 % interval excludes 0.")
    return "\n".join(out)


def comparison_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """``mutor train``'s table: one row per run, final evaluation (primary first), best primary, loss, time."""
    metrics: list[str] = []
    for run in runs:
        for k in final_eval(run):
            if k not in metrics and k != "num_eval":
                metrics.append(k)
    primary = _primary(runs)
    lead = primary if primary in metrics else NEXT_TOKEN_LOSS if NEXT_TOKEN_LOSS in metrics else None
    if lead is not None:                  # the task's metric first, else the loss every method measures alike
        metrics.remove(lead)
        metrics.insert(0, lead)
    named = [f"{m} (own objective)" if m == OWN_OBJECTIVE else m for m in metrics]
    header = (["method", "steps"] + named + (["best " + primary] if primary else [])
              + ["train loss (own objective)", "wall s"])
    rows = []
    for run in runs:
        fin = final_eval(run)
        sign = 1 if run.get("primary_higher_is_better", True) else -1
        vals = [h[f"eval_{primary}"] for h in run.get("eval_history", []) if f"eval_{primary}" in h]
        best = max(vals, key=lambda v: sign * v) if vals else None
        rows.append([run["method"], str(run["global_step"])]
                    + [f"{fin[m]:.4f}" if isinstance(fin.get(m), (int, float)) else "-" for m in metrics]
                    + ([f"{best:.4f}" if best is not None else "-"] if primary else [])
                    + [f"{run['train_loss']:.4f}", f"{run['wall_seconds']:.0f}"])
    return header, rows


def comparison_title(runs: list[dict], recipe=None) -> str:
    """What the table shows: the final held-out evaluation, or (a task without a training-time evaluator,
    such as the text benchmarks) training only, with the command that scores the runs (:func:`eval_command`,
    with the data of ``recipe``, a :class:`~mutor.run.recipe.Recipe`, when given)."""
    if any(final_eval(r) for r in runs):
        return "mutor train: methods compared (final held-out evaluation)"
    task = next((r.get("task") for r in runs if r.get("task")), "TASK")
    cmd = eval_command(task, getattr(recipe, "data", None), getattr(recipe, "source_dir", None))
    return (f"mutor train: methods compared (training only: task {task!r} has no held-out evaluation during "
            f"training; score the runs with `{cmd}`)")


def comparison_markdown(runs: list[dict], recipe=None) -> str:
    """``comparison.md``: title, the runs' table, the verdict (``recipe``: see :func:`comparison_title`)."""
    v = verdict(runs)
    return comparison_title(runs, recipe) + "\n\n" + _markdown(*comparison_rows(runs)) + (f"\n{v}\n" if v else "")


def print_comparison(runs: list[dict], recipe=None) -> None:
    """The runs' table and the verdict on the terminal (rich; ``recipe``: see :func:`comparison_title`)."""
    from rich.console import Console
    from rich.table import Table

    header, rows = comparison_rows(runs)
    table = Table(title=comparison_title(runs, recipe))
    for c in header:
        table.add_column(c, justify="left" if c == "method" else "right")
    for r in rows:
        table.add_row(*r)
    console = Console(width=max(100, 14 * len(header)))
    console.print(table)
    if verdict(runs):
        console.print(verdict(runs))


def _check_metrics(summaries: list[dict], metrics: Optional[list[str]]) -> None:
    """Refuse ``--metrics`` that no summary has, naming them (and why a training summary's ``loss`` is not
    there)."""
    if not metrics:
        return
    available = sorted({k for s in summaries for k in s["metrics"]})
    missing = [m for m in metrics if m not in available]
    if OWN_OBJECTIVE in missing and any(s.get("_training") for s in summaries):
        raise MutorUserError(f"--metrics {OWN_OBJECTIVE}: a training summary's eval_loss is each method's own "
                             "objective ((1-a)·L_ntp + a·L_reg for MuToR, L_ntp for next-token), a different "
                             f"quantity for each method, so it is not compared; {NEXT_TOKEN_LOSS}, the held-out "
                             f"next-token loss, is the same quantity for every method; available: {available}")
    if missing:
        raise MutorUserError(f"--metrics {missing}: in no summary; available: {available}")


def _check_comparable(summaries: list[dict]) -> None:
    """Refuse a training summary whose final held-out evaluation has nothing that every method measures the same
    way (no task metric, no next-token loss), with the command that scores its run."""
    for s in summaries:
        if s.get("_training") and s["primary"] is None:
            f = Path(s["_dir"]) / "summary.json"
            _, cmd = _score_command(f, Path(s["_dir"]))
            raise MutorUserError(f"{f}: its final held-out evaluation records neither its task's metric nor the "
                                 f"next-token loss (eval_{NEXT_TOKEN_LOSS}), and its eval_loss is the method's own "
                                 f"objective, a different quantity for each method, so it is not compared: score "
                                 f"the run with `{cmd}`, then compare what it writes")


def selected_on_reported_rows(summary: dict) -> bool:
    """Whether a summary reports a checkpoint on the same rows it was selected on (optimistic by construction).

    ``mutor eval --checkpoints`` records it as ``selected_on_reported_rows``; in a selection summary without that
    field, it is read from a selection split equal to the reported split.
    """
    if "selected_on_reported_rows" in summary:
        return bool(summary["selected_on_reported_rows"])
    return "selected_checkpoint" in summary and summary.get("selection_split") == summary.get("split")


def _optimistic(summaries: list[dict]) -> dict:
    """(method, task) -> the splits of its runs (summaries that count) whose checkpoint was selected on the rows it
    is reported on."""
    found: dict = defaultdict(list)
    for s in summaries:
        if selected_on_reported_rows(s) and s.get("split") not in found[(_method(s), s["task"])]:
            found[(_method(s), s["task"])].append(s.get("split"))
    return {k: v for k, v in found.items() if v}


def _cells(summaries: list[dict], metrics: Optional[list[str]]):
    """``mutor compare``'s values: (method, task, metric) -> one value per distinct run, in order found; the
    methods, the (task, metric) columns, the duplicates left out, and :func:`_optimistic` of the runs."""
    _check_metrics(summaries, metrics)
    summaries, notes = one_per_run(summaries)
    if not metrics:
        _check_comparable(summaries)
    cells: dict = defaultdict(list)
    methods: list[str] = []
    columns: list[tuple[str, str]] = []
    for s in summaries:
        method = _method(s)
        if method not in methods:
            methods.append(method)
        for m in (metrics or [s["primary"]]):
            if m in s["metrics"]:
                if (s["task"], m) not in columns:
                    columns.append((s["task"], m))
                cells[(method, s["task"], m)].append(s["metrics"][m])
    return cells, methods, columns, notes, _optimistic(summaries)


def _over_seeds(vals: list[float]) -> str:
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.3f}"
    txt = f"{statistics.fmean(vals):.3f} ± {statistics.stdev(vals):.3f}"
    return txt if len(vals) == 3 else f"{txt} (n={len(vals)})"


OPTIMISTIC_MARK = "†"
"""Marks a value whose checkpoint was selected on the rows it is reported on."""


def _cell(vals: list[float], optimistic: bool) -> str:
    """One cell of ``mutor compare``'s table: :func:`_over_seeds`, marked when its runs' checkpoints were selected
    on the rows they are reported on."""
    return _over_seeds(vals) + (f" {OPTIMISTIC_MARK}" if vals and optimistic else "")


def _optimistic_note(optimistic: dict) -> str:
    """The footnote of :data:`OPTIMISTIC_MARK`: what it means, and which method, task and split it marks."""
    which = "; ".join(f"{method} on {task} ({', '.join(map(str, splits))} rows)"
                      for (method, task), splits in optimistic.items())
    return (f"{OPTIMISTIC_MARK} checkpoint selected on the rows it is reported on, so optimistic by construction: "
            f"{which}")


def _captions(columns: list[tuple[str, str]]) -> list[str]:
    """What a column holds where its name alone does not say it: the held-out next-token loss."""
    return [f"{task} {metric}: held-out next-token loss (per supervised token), the same quantity for every "
            f"method, not a method's own training objective; lower is better"
            for task, metric in columns if metric == NEXT_TOKEN_LOSS]


def _in_percent(summary: dict) -> bool:
    """Whether a summary scores in percent: a text task's generations (``mutor eval --model`` or
    ``--checkpoints``, which record ``max_new_tokens``), 0 to 100 per example; synthetic tasks' evaluators and
    training's final evaluation give rates, 0 to 1."""
    return "max_new_tokens" in summary


def _seed_values(summaries: list[dict], metrics: Optional[list[str]]):
    """(method, task, metric) -> {seed: (value, examples)} over the summaries that count, for the seeds with
    exactly one run of that method (a seed run twice is not paired); ``examples`` is the number of examples a rate
    in [0, 1] was measured on, None where unknown or the metric is not such a rate (a percentage)."""
    summaries, _ = one_per_run(summaries)
    found: dict = defaultdict(lambda: defaultdict(list))
    for s in summaries:
        if s.get("seed") is None:
            continue
        n = None if _in_percent(s) else s.get("n")
        for m in (metrics or [s["primary"]]):
            if m in s["metrics"]:
                found[(_method(s), s["task"], m)][s["seed"]].append((s["metrics"][m], n))
    return {k: {sd: v[0] for sd, v in by.items() if len(v) == 1} for k, by in found.items()}


def higher_is_better(metric: str) -> Optional[bool]:
    """Which way a metric improves, where its name says so: a loss, bits per token and the Fréchet distance
    (``fd``) are better lower (False); otherwise None (a reading then says higher or lower)."""
    return False if metric.endswith("loss") or metric in ("bits_per_token", "fd") else None


def format_difference(iv) -> str:
    """A difference with its 95 % interval, with the digits its size needs.

    The interval's own digits (two significant digits of its half-width,
    :func:`~mutor.eval.claims.format_interval`); without an interval, two significant digits of the difference
    itself. Either way a difference that is not 0 never reads as 0 (``-0.009``, not ``-0.0``), and a bound that
    is not 0 keeps its sign.

    Args:
        iv: The difference and its interval (:class:`~mutor.eval.claims.Interval`).

    Returns:
        E.g. ``+0.20 [-0.05, +0.45]``, or ``-0.0090 [no interval]``.
    """
    import math

    from .claims import decimals, format_interval

    d = decimals(iv.half) if not math.isnan(iv.half) else decimals(abs(iv.mean))
    while d < 6 and iv.mean != 0 and round(iv.mean, d) == 0:
        d += 1
    return format_interval(iv, digits=d)


def paired_differences(summaries: list[dict], metrics: Optional[list[str]] = None) -> list[str]:
    """Each method against ``next_token`` on the same task and metric, paired by seed, by the claim rule
    (:mod:`mutor.eval.claims`): the mean of the per-seed differences with its 95 % t-interval over the seeds
    paired; one seed of two rates measured on a known number of examples gets their interval on the examples
    (:func:`~mutor.eval.claims.unpaired_rates`). The summaries hold no per-example outcomes, so the per-example
    floor of the rule is not applied here. Numbers are written by :func:`format_difference`; a loss is read as
    better lower (:func:`higher_is_better`); a comparison with a value selected on the rows it reports ends with
    :data:`OPTIMISTIC_MARK`.

    Args:
        summaries: Evaluation or training summaries (:func:`collect_summaries`).
        metrics: The metrics compared (default: each task's primary metric, :func:`comparable_metric` for a
            training summary).

    Returns:
        One line per method, task and metric with at least one seed paired; empty without ``next_token`` runs.
    """
    from .claims import paired, reading, unpaired_rates

    values = _seed_values(summaries, metrics)
    optimistic = _optimistic(one_per_run(summaries)[0])
    lines = []
    for (method, task, metric), by_seed in values.items():
        ref = values.get(("next_token", task, metric))
        if method == "next_token" or not ref:
            continue
        seeds = sorted(set(by_seed) & set(ref))
        if not seeds:
            continue
        diffs = [by_seed[sd][0] - ref[sd][0] for sd in seeds]
        iv = paired(diffs)
        (a, n), (b, _) = by_seed[seeds[0]], ref[seeds[0]]
        if len(seeds) == 1 and n and 0 <= a <= 1 and 0 <= b <= 1:
            iv = unpaired_rates(a, b, int(n))
        where = f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} paired" + \
                (f", {int(n)} examples" if len(seeds) == 1 and iv.source == "examples" else "")
        mark = f" {OPTIMISTIC_MARK}" if (method, task) in optimistic or ("next_token", task) in optimistic else ""
        lines.append(f"- {method} minus next_token, {task} {metric}: {format_difference(iv)} ({where}): "
                     f"{reading(iv, higher_is_better(metric), 'next_token')}{mark}")
    return lines


def comparison_table(summaries: list[dict], metrics: Optional[list[str]] = None) -> str:
    """Markdown table: one row per method, one column per (task, metric); mean ± sample std over seeds.

    Each task's column is its primary metric unless ``metrics`` names others; a training summary's is
    :func:`comparable_metric` (its task's metric, else the held-out next-token loss, never a method's own
    objective), and a column of the next-token loss says so below the table. A value whose checkpoint was
    selected on the rows it is reported on is marked :data:`OPTIMISTIC_MARK`, with a footnote naming its split.
    Below, each method against ``next_token`` paired by seed (:func:`paired_differences`), where both have runs of
    the same seeds, and the duplicate summaries left out.
    """
    cells, methods, columns, notes, optimistic = _cells(summaries, metrics)
    rows = [[meth] + [_cell(cells.get((meth, t, m), []), (meth, t) in optimistic) for t, m in columns]
            for meth in methods]
    text = _markdown(["method"] + [f"{t} {m}" for t, m in columns], rows)
    captions = _captions(columns)
    if captions:
        text += "\n" + "".join(f"{c}\n" for c in captions)
    if optimistic:
        text += f"\n{_optimistic_note(optimistic)}\n"
    diffs = paired_differences(summaries, metrics)
    if diffs:
        text += ("\nAgainst next_token, paired by seed (mean difference [95 % interval]; a difference is claimed "
                 "only with three seeds or more whose interval excludes 0, fewer are exploratory):\n"
                 + "".join(f"{d}\n" for d in diffs))
    if notes:
        text += "\nDuplicates (each run is counted once):\n" + "".join(f"- {n}\n" for n in notes)
    return text


# ------------------------------------------------------------------ figures
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")


def _pyplot():
    """pyplot on the file-only Agg backend (no display is ever needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> None:
    """The one way a figure is written: PNG at 110 dpi, atomically, then closed."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    _pyplot().close(fig)


def curves_figure(runs: list[dict], title: str = ""):
    """Primary held-out metric (if any) and training ntp loss over steps, one line per method. Each method
    has its own marker, line style and a shrinking marker size, so identical curves (e.g. two methods on
    the same plateau) stay visible; a panel with nothing to draw says why."""
    primary = _primary(runs)
    panels = ([("eval", primary)] if primary else []) + [("train", "ntp_loss")]
    fig, axes = _pyplot().subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (kind, key) in zip(axes[0], panels):
        for i, run in enumerate(runs):
            if kind == "eval":
                pts = [(h["eval_step"], h.get(f"eval_{key}")) for h in run.get("eval_history", [])]
            else:
                pts = [(h["step"], h.get("ntp_loss", h.get("loss"))) for h in run.get("train_history", [])]
            pts = [(s, v) for s, v in pts if v is not None]
            if pts:
                ax.plot(*zip(*pts), marker=MARKERS[i % len(MARKERS)], ms=max(7 - 1.5 * i, 2.5), mfc="none",
                        ls=LINESTYLES[i % len(LINESTYLES)], color=f"C{i}", label=run["method"])
        ax.set_title(f"held-out {key}" if kind == "eval" else "training next-token loss", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "nothing logged" if kind == "eval" else "no training loss logged",
                    ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def comparison_plot(summaries: list[dict], path: str, metrics: Optional[list[str]] = None) -> None:
    """Bars of each (task, metric) per method: mean over seeds, error bars = sample std, dots = seeds."""
    cells, methods, columns, _, _ = _cells(summaries, metrics)
    fig, axes = _pyplot().subplots(1, len(columns), figsize=(3.2 * len(columns), 3.2), squeeze=False)
    for ax, (t, m) in zip(axes[0], columns):
        for i, meth in enumerate(methods):
            vals = cells.get((meth, t, m), [])
            if not vals:
                continue
            err = statistics.stdev(vals) if len(vals) > 1 else 0.0
            ax.bar(i, statistics.fmean(vals), yerr=err, capsize=4, color=f"C{i}", alpha=0.7)
            ax.plot([i] * len(vals), vals, "k.", ms=4)
        ax.set_xticks(range(len(methods)), methods, rotation=20, fontsize=8)
        ax.set_title(f"{t}: {m}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


# ------------------------------------------------------------------ writing
def write_comparison(root: Path, recipe, runs: list[dict]) -> None:
    """``mutor train``'s files for a recipe (a :class:`~mutor.run.recipe.Recipe`) and its runs so far."""
    write_json_atomic(root / "comparison.json", {"recipe": recipe.to_dict(), "runs": runs})
    write_text_atomic(root / "comparison.md", comparison_markdown(runs, recipe))
    _save(curves_figure(runs, title=recipe.name), root / "curves.png")
