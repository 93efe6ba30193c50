"""What each loss weight costs in accuracy and buys in drafting speed: the loss-weight sweep as one table and one
figure, per task and model.

For each group (by default the sweep's: word reversal and number sorting at three epochs, and the Gemma 3 270M
step once it has rows) and each MuToR weight a:

- accuracy: MuToR at a minus next-token of the same group and seed, exact match on test in points, the mean over
  seeds with its 95 % interval and reading by the claim rule (:mod:`mutor.eval.claims`, through report.py's
  pairing);
- drafting: each MuToR run's latest drafting row (experiments/evidence/drafting.py, greedy against K = 1..d_max and
  ``auto``, interleaved per prompt): the speed-ups over greedy of K = 1 (plain decoding on the drafting code path:
  its overhead), of the best fixed K and of ``auto``, each the geometric mean over the seeds;
- validation: the mean validation exact match at the selected checkpoint, over every run of that weight in the
  group.

Below the table, the sweep's best weight by the plan's rule, fixed before its runs: the highest mean validation
exact match over both sweep tasks' runs of that weight (three seeds each), a tie to the larger weight; undecided
until every weight has all its runs. Then the margin behind the pick, in validation items (how many each weight's
runs got right, per task and over both), and the weights against each other: MuToR at one weight minus MuToR at
another, paired by seed, test exact match, read by the claim rule (not among the readings the plan declared before
the runs). The figure plots the accuracy difference against ``auto``'s speed-up, the draft length a user gets by
default.

    python experiments/evidence/tradeoff.py                        # the table
    python experiments/evidence/tradeoff.py --plot experiments/evidence/tradeoff.png --markdown docs/FILE.md

``--markdown`` writes the table between the file's ``<!-- tradeoff:begin -->`` and ``<!-- tradeoff:end -->``
markers. A weight with fewer than three seeds is shown as exploratory.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional

from report import _per, comparisons, latest_drafts, load, reading, replace_between

from mutor.eval.claims import format_interval, paired
from mutor.run.recipe import load_recipe
from mutor.utils.io import yaml_load

HERE = Path(__file__).resolve().parent
SWEEP = ("rg-word-reversal-3ep-sweep", "rg-number-sorting-3ep-sweep")
GROUPS = (*SWEEP, "rg-gemma3-word-reversal-2ep")
LABELS = {                                      # group: (task and budget, model), as the page names them
    "rg-word-reversal-3ep-sweep": ("word reversal, 3 epochs", "SmolLM2-135M"),
    "rg-number-sorting-3ep-sweep": ("number sorting, 3 epochs", "SmolLM2-135M"),
    "rg-gemma3-word-reversal-2ep": ("word reversal, 2 epochs of 128 items", "Gemma 3 270M"),
}
WEIGHTS = (0.05, 0.1, 0.2, 0.3)                  # the sweep's weights, among which its best one is picked
SEEDS = 3
MARKS = ("<!-- tradeoff:begin -->", "<!-- tradeoff:end -->")


@functools.cache
def _shipped_as_trained() -> dict[str, list[str]]:
    import driver  # same folder; only for rows that record no resolved recipe

    return driver.as_trained(yaml_load((HERE / "plan.yaml").read_text()), HERE / "plan.yaml")


def weight(row: dict, as_trained: Optional[dict[str, list[str]]] = None) -> Optional[float]:
    """A MuToR run's loss weight a: from its resolved recipe; for a row without one, its recipe resolved as the run
    was, with the plan's ``as_trained`` values for its group (``as_trained``: group -> overrides; default: the
    shipped plan's) and then its own overrides; for a row naming no recipe, its ``mutor.loss_weight=`` override
    (None where none is found)."""
    value = ((row.get("resolved_recipe") or {}).get("mutor") or {}).get("loss_weight")
    overrides = list(row.get("overrides") or [])
    if value is None and row.get("recipe"):
        pinned = (_shipped_as_trained() if as_trained is None else as_trained).get(row.get("group"), [])
        overrides = [*pinned, *overrides]
        try:
            value = load_recipe(row["recipe"], overrides).mutor.get("loss_weight")
        except FileNotFoundError:
            return None
    if value is None:
        value = next((o.split("=", 1)[1] for o in overrides if o.startswith("mutor.loss_weight=")), None)
    return None if value is None else float(value)


def _geomean(xs: list[float]) -> float:
    return statistics.geometric_mean(xs) if xs else float("nan")


def _validation(row: dict) -> Optional[float]:
    """Validation exact match (points) at the run's selected checkpoint."""
    for c in row.get("per_checkpoint") or []:
        if c.get("checkpoint") == row.get("selected_checkpoint") and c.get("accuracy") is not None:
            return 100 * c["accuracy"] if c["accuracy"] <= 1 else c["accuracy"]
    return None


def tradeoff(rows: list[dict], drafts: list[dict], groups=GROUPS) -> list[dict]:
    """One entry per group and MuToR weight: ``group``, ``weight``, ``comparison`` (report.py's, on test exact
    match), ``k1``, ``best_k`` and ``auto`` (speed-ups over greedy, geometric mean over the seeds with a drafting
    row), ``draft_seeds``, ``validation`` (mean validation exact match of the weight's runs)."""
    drafts, out = latest_drafts(drafts), []
    for group in groups:
        mine = [r for r in rows if r["group"] == group]
        comps = {c["comparison"]: c for c in comparisons(mine)
                 if c["split"] == "test" and c["baseline"] == "next_token" and "loss" not in c["measure"]}
        by_weight = defaultdict(list)
        for r in (r for r in mine if r["method"] == "mutor"):
            a = weight(r)
            if a is not None:
                by_weight[a].append(r)
        for a, runs in sorted(by_weight.items()):
            labels = {("mutor" + (f" ({r['tag']})" if r["tag"] else "")) for r in runs}
            comp = next((comps[f"{label} - next_token"] for label in sorted(labels)
                         if f"{label} - next_token" in comps), None)
            names = {r["run"] for r in runs}
            rows_d = [d for d in drafts if d["group"] == group and d["run"] in names]
            best = [max(v["speedup_vs_greedy"] for k, v in d["drafting"].items() if k not in ("K=1", "K=auto"))
                    for d in rows_d]
            auto = [d["drafting"]["K=auto"]["speedup_vs_greedy"] for d in rows_d if "K=auto" in d["drafting"]]
            k1 = [d["drafting"]["K=1"]["speedup_vs_greedy"] for d in rows_d if "K=1" in d["drafting"]]
            val = [v for v in map(_validation, runs) if v is not None]
            out.append({"group": group, "weight": a, "comparison": comp, "k1": _geomean(k1), "best_k": _geomean(best),
                        "auto": _geomean(auto), "draft_seeds": len(rows_d),
                        "validation": sum(val) / len(val) if val else float("nan"), "runs": len(runs)})
    return out


def pick(rows: list[dict], groups=SWEEP, weights=WEIGHTS, seeds: int = SEEDS) -> dict:
    """The sweep's best weight by the plan's rule: the highest mean validation exact match over the runs of that
    weight in ``groups`` (``seeds`` each), a tie to the larger weight. ``{"weight": a or None (undecided while a
    weight lacks runs), "means": {a: mean}, "runs": {a: runs counted}, "expected": runs per weight}``."""
    vals: dict[float, list[float]] = {a: [] for a in weights}
    for r in rows:
        a = weight(r) if r["group"] in groups and r["method"] == "mutor" else None
        v = _validation(r) if a in vals else None
        if v is not None:
            vals[a].append(v)
    means = {a: sum(v) / len(v) for a, v in vals.items() if v}
    expected = seeds * len(groups)
    done = all(len(v) == expected for v in vals.values())
    best = max(means, key=lambda a: (means[a], a)) if done else None
    return {"weight": best, "means": means, "runs": {a: len(v) for a, v in vals.items()}, "expected": expected}


def pick_line(p: dict) -> str:
    """The pick as one sentence under the table."""
    means = ", ".join(f"a = {a:g}: {m:.1f} % ({p['runs'][a]} runs)" for a, m in sorted(p["means"].items()))
    head = "Best weight on validation (the plan's rule):"
    if p["weight"] is None:
        return f"{head} undecided until each weight has {p['expected']} runs ({means})."
    return f"{head} **a = {p['weight']:g}** ({means})."


def _num_validation(row: dict) -> Optional[int]:
    """How many validation items the run was picked on: ``data.num_validation`` of its resolved recipe, else of
    its overrides (None where neither says)."""
    n = ((row.get("resolved_recipe") or {}).get("data") or {}).get("num_validation")
    if n is None:
        n = next((o.split("=", 1)[1] for o in row.get("overrides") or [] if o.startswith("data.num_validation=")),
                 None)
    return None if n is None else int(n)


def margin(rows: list[dict], groups=SWEEP, weights=WEIGHTS) -> dict:
    """The validation items behind the pick: ``{"right": {group: {a: items right}}, "of": {group: {a: items}}}``
    over the runs of each weight in each group, at their selected checkpoints."""
    right: dict = {g: {a: 0 for a in weights} for g in groups}
    of: dict = {g: {a: 0 for a in weights} for g in groups}
    for r in rows:
        a = weight(r) if r["group"] in groups and r["method"] == "mutor" else None
        n, v = (_num_validation(r), _validation(r)) if a in weights else (None, None)
        if n is not None and v is not None:
            right[r["group"]][a] += round(v * n / 100)
            of[r["group"]][a] += n
    return {"right": right, "of": of}


def margin_line(rows: list[dict], p: dict, groups=SWEEP) -> str:
    """The margin behind the pick in validation items: per task and over both, how many each weight's runs got
    right, and by how many items the picked weight leads the next."""
    m = margin(rows, groups, tuple(sorted(p["means"])))
    if not any(m["of"][g][a] for g in groups for a in m["of"][g]):
        return ""
    parts = []
    for g in groups:
        n = max(m["of"][g].values())
        parts.append(f"{LABELS.get(g, (g,))[0]}: " + ", ".join(f"a = {a:g}: {k}" for a, k in m["right"][g].items())
                     + f" of {n}")
    total = {a: sum(m["right"][g][a] for g in groups) for a in m["right"][groups[0]]}
    n = sum(max(m["of"][g].values()) for g in groups)
    text = ("Validation items right at the selected checkpoints (" + "; ".join(parts) + "; over both: "
            + ", ".join(f"a = {a:g}: {k}" for a, k in total.items()) + f" of {n}).")
    if p["weight"] is not None:
        rest = sorted((k, a) for a, k in total.items() if a != p["weight"])
        if rest:
            k, a = rest[-1]
            text += f" The pick leads a = {a:g}, the next, by {total[p['weight']] - k} items of {n}."
    return text


def between(rows: list[dict], groups=GROUPS, split: str = "test") -> list[dict]:
    """The weights against each other, per group: MuToR at a minus MuToR at b (a < b), paired by seed on the same
    held-out items, on the primary score, by the claim rule. One dict per pair: ``group``, ``a``, ``b``,
    ``interval`` (:func:`mutor.eval.claims.paired`), ``reading`` and ``seeds``."""
    out = []
    for group in groups:
        by: dict = defaultdict(dict)                               # weight -> seed -> per-example scores
        for r in rows:
            if r["group"] == group and r["method"] == "mutor":
                a, per = weight(r), _per(r, split, "per_example")
                if a is not None and per is not None:
                    by[a][r["seed"]] = per
        ws = sorted(by)
        for i, a in enumerate(ws):
            for b in ws[i + 1:]:
                seeds = sorted(set(by[a]) & set(by[b]))
                diffs = [[x - y for x, y in zip(by[a][s], by[b][s])] for s in seeds
                         if len(by[a][s]) == len(by[b][s])]
                if not diffs:
                    continue
                iv = paired(per_example=diffs)
                c = {"interval": iv, "baseline": f"MuToR at a = {b:g}", "measure": "exact match (points)"}
                out.append({"group": group, "a": a, "b": b, "interval": iv, "reading": reading(c),
                            "seeds": iv.seeds})
    return out


def between_table(pairs: list[dict]) -> str:
    """:func:`between`'s pairs as a markdown table."""
    lines = ["| task | model | MuToR at a − MuToR at b | seeds | difference, test exact match, points "
             "[95 % interval] | reading |", "|---|---|---|---:|---|---|"]
    for x in pairs:
        task, model = LABELS.get(x["group"], (x["group"], "-"))
        lines.append(f"| {task} | {model} | {x['a']:g} − {x['b']:g} | {x['seeds']} | "
                     f"{format_interval(x['interval'])} | {x['reading']} |")
    return "\n".join(lines)


def table(entries: list[dict]) -> str:
    """The entries as a markdown table."""
    lines = ["| task | model | a | seeds | MuToR − next-token, test exact match, points [95 % interval] | reading | "
             "K=1 vs greedy | best fixed K vs greedy | `auto` vs greedy | validation exact match % |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for e in entries:
        c = e["comparison"]
        diff, what, seeds = (format_interval(c["interval"]), reading(c), c["seeds"]) if c else ("-", "-", 0)
        speed = lambda x: "-" if math.isnan(x) else f"{x:.2f}x"                   # noqa: E731
        val = "-" if math.isnan(e["validation"]) else f"{e['validation']:.1f}"
        task, model = LABELS.get(e["group"], (e["group"], "-"))
        lines.append(f"| {task} | {model} | {e['weight']:g} | {seeds} | {diff} | {what} | {speed(e['k1'])} | "
                     f"{speed(e['best_k'])} | {speed(e['auto'])} | {val} |")
    return "\n".join(lines)


def plot(entries: list[dict], path: str) -> None:
    """Accuracy difference (points, 95 % interval) against ``auto``'s speed-up, one point per weight, one colour per
    group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, group in enumerate(dict.fromkeys(e["group"] for e in entries)):
        pts = [e for e in entries if e["group"] == group and e["comparison"] and not math.isnan(e["auto"])]
        if not pts:
            continue
        xs = [e["auto"] for e in pts]
        ys = [e["comparison"]["mean"] for e in pts]
        lo = [y - e["comparison"]["interval"].low if not math.isnan(e["comparison"]["interval"].low) else 0
              for y, e in zip(ys, pts)]
        hi = [e["comparison"]["interval"].high - y if not math.isnan(e["comparison"]["interval"].high) else 0
              for y, e in zip(ys, pts)]
        name = ", ".join(LABELS.get(group, (group,)))
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", color=f"C{i}", capsize=3, label=name)
        for x, y, e in zip(xs, ys, pts):
            ax.annotate(f"a={e['weight']:g}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(0, color="grey", lw=0.8)
    ax.margins(x=0.15)                                                  # room for the weights' labels
    ax.set_xlabel("drafting speed-up over greedy, auto (float32, CPU, batch size 1)")
    ax.set_ylabel("MuToR − next-token, test exact match (points)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results.jsonl")
    ap.add_argument("--drafting", type=Path, default=HERE / "drafting.jsonl")
    ap.add_argument("--group", action="append", default=None, help="a group to show (repeatable; default: the sweep's)")
    ap.add_argument("--plot", default=None, help="write the figure here (PNG)")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table between this file's markers")
    args = ap.parse_args(argv)
    rows = load(args.results)
    entries = tradeoff(rows, load(args.drafting), tuple(args.group or GROUPS))
    p = pick(rows)
    text = table(entries) + "\n\n" + pick_line(p)
    if margin_line(rows, p):
        text += " " + margin_line(rows, p)
    pairs = between(rows, tuple(args.group or GROUPS))
    if pairs:
        text += ("\n\nThe weights against each other (MuToR at one weight minus MuToR at another of the same seed, "
                 "same test items, read by the claim rule; not among the readings declared before the runs, and "
                 "six pairs per task, so a description of these rows rather than a finding):\n\n"
                 + between_table(pairs))
    print(text)
    if args.plot:
        plot(entries, args.plot)
    if args.markdown:
        doc = args.markdown.read_text()
        if MARKS[0] not in doc or MARKS[1] not in doc:
            raise SystemExit(f"{args.markdown}: no {MARKS[0]} ... {MARKS[1]} markers to write the table between")
        args.markdown.write_text(replace_between(doc, text, *MARKS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
