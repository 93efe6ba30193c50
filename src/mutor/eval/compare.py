"""``mutor compare``: the paper-style table (method x task) from saved evaluation or training summaries.

Runs that differ only in seed are averaged: each cell is ``mean ± std`` of the task's primary
metric over seeds (sample standard deviation, n-1; the paper reports three seeds), with the
number of seeds when it is not 3.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional

__all__ = ["collect_summaries", "comparison_table"]


def _from_training(data: dict) -> Optional[dict]:
    """A training run's ``summary.json`` as an evaluation summary: its final held-out evaluation."""
    hist = data.get("eval_history") or []
    if not hist or "method" not in data:
        return None
    metrics = {k[5:]: v for k, v in hist[-1].items() if k.startswith("eval_") and k not in ("eval_step",)}
    metrics.pop("num_eval", None)
    return {"task": data.get("task", "?"), "split": "held-out", "model": data.get("recipe", "?"), "n": None,
            "metrics": metrics, "primary": data.get("primary_metric") or next(iter(metrics)),
            "method": data["method"], "seed": data.get("seed")}


def collect_summaries(paths: list[str]) -> list[dict]:
    """Evaluation ``summary.json`` files (or training runs' ones: their final evaluation), or directories
    searched recursively for them.

    Under a checkpoint selection (a summary with ``selected_checkpoint``), only the selection counts,
    not the per-checkpoint summaries below it.
    """
    found: list[dict] = []
    for p in map(Path, paths):
        for f in ([p] if p.is_file() else sorted(p.rglob("summary.json"))):
            data = json.loads(f.read_text())
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


def _cells(summaries: list[dict], metrics: Optional[list[str]]):
    cells: dict = defaultdict(list)
    methods: list[str] = []
    columns: list[tuple[str, str]] = []
    for s in summaries:
        method = s.get("method") or Path(s["model"]).name
        if method not in methods:
            methods.append(method)
        for m in (metrics or [s["primary"]]):
            if m in s["metrics"]:
                if (s["task"], m) not in columns:
                    columns.append((s["task"], m))
                cells[(method, s["task"], m)].append(s["metrics"][m])
    return cells, methods, columns


def comparison_table(summaries: list[dict], metrics: Optional[list[str]] = None) -> str:
    """Markdown table: one row per method, one column per (task, metric); mean ± sample std over seeds."""
    cells, methods, columns = _cells(summaries, metrics)
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
    return "\n".join(lines) + "\n"


def comparison_plot(summaries: list[dict], path: str, metrics: Optional[list[str]] = None) -> None:
    """Bars of each (task, metric) per method: mean over seeds, error bars = sample std, dots = seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import atomic_write

    cells, methods, columns = _cells(summaries, metrics)
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
