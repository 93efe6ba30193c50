"""``mutor compare``: the paper-style table (method x task) from saved evaluation summaries.

Runs that differ only in seed are averaged: each cell is ``mean ± std`` of the task's primary
metric over seeds (sample standard deviation, n-1; the paper reports three seeds), with the
number of seeds when it is not 3.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

__all__ = ["collect_summaries", "comparison_table"]


def collect_summaries(paths: list[str]) -> list[dict]:
    """``summary.json`` files, or directories searched recursively for evaluation summaries.

    Under a checkpoint selection (a summary with ``selected_checkpoint``), only the selection counts,
    not the per-checkpoint summaries below it.
    """
    found: list[dict] = []
    for p in map(Path, paths):
        for f in ([p] if p.is_file() else sorted(p.rglob("summary.json"))):
            data = json.loads(f.read_text())
            if "task" in data and "metrics" in data and "primary" in data:
                found.append({**data, "_dir": f.parent})
    selections = [s["_dir"] for s in found if "selected_checkpoint" in s]
    kept = [s for s in found if "selected_checkpoint" in s
            or not any(sel in s["_dir"].parents for sel in selections)]
    if not kept:
        raise FileNotFoundError(f"no evaluation summary.json under {paths}")
    return kept


def comparison_table(summaries: list[dict]) -> str:
    cells: dict = defaultdict(list)
    tasks: list[str] = []
    methods: list[str] = []
    for s in summaries:
        method = s.get("method") or Path(s["model"]).name
        if s["task"] not in tasks:
            tasks.append(s["task"])
        if method not in methods:
            methods.append(method)
        cells[(method, s["task"])].append((s.get("seed"), s["metrics"][s["primary"]]))
    primary = {s["task"]: s["primary"] for s in summaries}
    lines = ["| method | " + " | ".join(f"{t} ({primary[t]})" for t in tasks) + " |", "|" + "---|" * (1 + len(tasks))]
    for m in methods:
        row = []
        for t in tasks:
            vals = [v for _, v in cells.get((m, t), [])]
            if not vals:
                row.append("-")
            elif len(vals) == 1:
                row.append(f"{vals[0]:.2f}")
            else:
                txt = f"{statistics.fmean(vals):.2f} ± {statistics.stdev(vals):.2f}"
                row.append(txt if len(vals) == 3 else f"{txt} (n={len(vals)})")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
