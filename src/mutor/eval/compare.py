"""``mutor compare``: the paper-style table (method x task) from saved evaluation or training summaries.

Runs that differ only in seed are averaged: each cell is ``mean ± std`` of the task's primary
metric over seeds (sample standard deviation, n-1; the paper reports three seeds), with the
number of seeds when it is not 3.

One run is one sample. A run can have several summaries (its training summary, an evaluation of
its final model, a checkpoint selection, the same file named twice); they are recognised by the
run directory they belong to, only one of them counts (a checkpoint selection before an
evaluation before the training summary's final evaluation), and the table says which were left
out, so ``n`` counts distinct runs.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional

from ..errors import MutorUserError

__all__ = ["collect_summaries", "comparison_table", "one_per_run", "run_of"]


def _from_training(data: dict) -> Optional[dict]:
    """A training run's ``summary.json`` as an evaluation summary: its final held-out evaluation."""
    hist = data.get("eval_history") or []
    if not hist or "method" not in data:
        return None
    metrics = {k[5:]: v for k, v in hist[-1].items() if k.startswith("eval_") and k not in ("eval_step",)}
    metrics.pop("num_eval", None)
    return {"task": data.get("task", "?"), "split": "held-out", "model": data.get("recipe", "?"), "n": None,
            "metrics": metrics, "primary": data.get("primary_metric") or next(iter(metrics)),
            "method": data["method"], "seed": data.get("seed"), "_training": True}


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
    selections = [s["_dir"] for s in found if "selected_checkpoint" in s]
    kept = [s for s in found if "selected_checkpoint" in s
            or not any(sel in s["_dir"].parents for sel in selections)]
    if not kept:
        raise FileNotFoundError(f"no evaluation summary.json under {paths}")
    return kept


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


def _check_metrics(summaries: list[dict], metrics: Optional[list[str]]) -> None:
    if not metrics:
        return
    available = sorted({k for s in summaries for k in s["metrics"]})
    missing = [m for m in metrics if m not in available]
    if missing:
        raise MutorUserError(f"--metrics {missing}: in no summary; available: {available}")


def _cells(summaries: list[dict], metrics: Optional[list[str]]):
    _check_metrics(summaries, metrics)
    summaries, notes = one_per_run(summaries)
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
    return cells, methods, columns, notes


def comparison_table(summaries: list[dict], metrics: Optional[list[str]] = None) -> str:
    """Markdown table: one row per method, one column per (task, metric); mean ± sample std over seeds."""
    cells, methods, columns, notes = _cells(summaries, metrics)
    lines = ["| method | " + " | ".join(f"{t} {m}" for t, m in columns) + " |", "|" + "---|" * (1 + len(columns))]
    for meth in methods:
        row = []
        for t, m in columns:
            vals = cells.get((meth, t, m), [])
            if not vals:
                row.append("-")
            elif len(vals) == 1:
                row.append(f"{vals[0]:.3f}")
            else:
                txt = f"{statistics.fmean(vals):.3f} ± {statistics.stdev(vals):.3f}"
                row.append(txt if len(vals) == 3 else f"{txt} (n={len(vals)})")
        lines.append(f"| {meth} | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\nDuplicates (n counts distinct runs):\n" + "".join(f"- {n}\n" for n in notes)
    return text


def comparison_plot(summaries: list[dict], path: str, metrics: Optional[list[str]] = None) -> None:
    """Bars of each (task, metric) per method: mean over seeds, error bars = sample std, dots = seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import atomic_write

    cells, methods, columns, _ = _cells(summaries, metrics)
    fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns), 3.2), squeeze=False)
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
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
