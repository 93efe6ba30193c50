"""The evidence rows (results.jsonl) as tables, a plot and a reading of each comparison by the claim rule.

Every comparison is paired: a run against next-token of the same group and seed (the same initialisation,
data and batch order), per example of the same held-out items; a diagnostic group that the plan gives a
``reference`` against that group's runs of the methods it names, instead; a group's ``also_against`` tags add
its tagged next-token runs of those tags as baselines for its other methods (the compute check), and a tagged
run is also paired with next-token of its own tag where there is one (the same budget).

The claim rule is :mod:`mutor.eval.claims`, the one the library's reports use too: the mean of the per-seed
differences with its 95 % t-interval (n - 1 degrees of freedom), or the per-example interval where that is
wider; a difference is claimed only with three seeds or more and an interval that excludes 0; fewer seeds are
exploratory. Every comparison is shown with its interval. Exact match is in points (percent), answer loss in
nats.

    python experiments/evidence/report.py                       # print the tables and the readings
    python experiments/evidence/report.py --readme docs/evidence.md \
        --plot experiments/evidence/evidence.png --curves experiments/evidence/curves.png
    python experiments/evidence/report.py --against-two-se      # where "beyond 2 s.e." would read otherwise

Rows trained again (``reproduce.py --record``, ``reproductions.jsonl``) are judged here again, each time, by the
reproduction rule (:data:`REPRODUCED`, :func:`judge`) against the rows as they are, from the fresh per-example
scores kept beside them.

``--readme`` names the files that hold the generated blocks: each block is written where its markers are (the
at-a-glance table between the ``GLANCE`` markers, the rows, paired differences and readings between ``BEGIN`` and
``END``). The plan's ``tasks`` block lays out the at-a-glance table: each task at every budget it was run,
side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Optional

from mutor.eval.claims import Interval, decimals, format_interval, paired, t_critical
from mutor.eval.claims import reading as claim_reading

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- evidence:begin -->", "<!-- evidence:end -->"
GLANCE = ("<!-- evidence-glance:begin -->", "<!-- evidence-glance:end -->")   # optional: the summary table apart
MEASURES = {"exact match (points)": "per_example", "answer loss (nats)": "answer_loss_per_example"}


def _measure(row: dict, measure: str) -> str:
    """The measure's name for this group: the per-example score is named by the group's primary metric
    (exact match; a star graph's solve rate)."""
    primary = row.get("primary", "accuracy")
    if MEASURES[measure] != "per_example" or primary == "accuracy":
        return measure
    return f"{primary.replace('_', ' ')} (points)"


def generations_path(results: Path, group: str, run: str, split: str) -> Path:
    """Where a run's scored generations on ``split`` are kept, beside the results file (gzipped JSON lines;
    driver.py writes them with the run's row, error_kinds.py reads them)."""
    return results.parent / "generations" / group / run / f"{split}.jsonl.gz"


def reproduction_path(results: Path, group: str, run: str, split: str) -> Path:
    """Where the scored generations of a row trained again (``reproduce.py --record``) are kept, beside the
    results file."""
    return results.parent / "reproductions" / group / run / f"{split}.jsonl.gz"


def reproduction_row_path(results: Path, group: str, run: str) -> Path:
    """Where the fresh row of a row trained again (``reproduce.py --record``) is kept: its per-example scores and
    answer losses, which the reproduction is judged by."""
    return results.parent / "reproductions" / group / run / "row.json"


def load(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def latest_drafts(drafts: list[dict]) -> list[dict]:
    """One drafting row per run: its latest (a run measured again, with newer drafting code or on a quiet machine,
    is reported by that measurement)."""
    return list({(d["group"], d["run"]): d for d in drafts}.values())


def label(row: dict) -> str:
    """A run's method as tables name it: ``mutor``, or ``mutor (a0.1)`` for a tagged run."""
    return row["method"] + (f" ({row['tag']})" if row["tag"] else "")


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else float("nan"))


def runs_table(rows: list[dict], results: Optional[Path] = None) -> str:
    """One group's runs: per split the score (mean ± s.e. over its examples) and the answer loss, the training
    loss at the end, the training's CPU time and peak memory; with ``results`` (the results file), which splits'
    scored answers are committed beside it (``generations/``; the rest are in the run directories only)."""
    splits = sorted({s for r in rows for s in r["splits"]}, key=lambda s: (s != "test", s))
    score = {"accuracy": "EM"}.get(rows[0].get("primary", "accuracy"), rows[0].get("primary"))  # solve_rate ...
    head = ["method", "seed", "epochs", "checkpoint"] + [f"{s} {score} %" for s in splits] + \
           [f"{s} answer loss" for s in splits] + ["train ntp loss (end)", "train CPU h", "peak GB"] + \
           (["answers committed"] if results else [])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {"next_token": 0, "multi_token": 1, "mutor": 2}
    for r in sorted(rows, key=lambda r: (r["tag"], order.get(r["method"], 9), r["seed"])):
        cells = [label(r), str(r["seed"]), str(r["epochs"]),
                 r["selected_checkpoint"].replace("checkpoint-", "step ")]
        for s in splits:
            per = _per(r, s, "per_example")
            cells.append("{:.1f} ± {:.1f}".format(*_mean_se(per)) + f" (n={len(per)})" if per else "-")
        for s in splits:
            sp = r["splits"].get(s, {})
            cells.append(f"{sp['answer_loss']:.4f} ± {sp['answer_loss_se']:.4f}" if sp.get("answer_loss") else "-")
        partial = r.get("train_cost_complete") is False          # segments before the first recorded one are missing
        cells += [str(r.get("train_ntp_loss_last") or "-"),
                  (">= " if partial else "") + f"{r['train_cpu_seconds'] / 3600:.2f}", str(r["peak_rss_gb"])]
        if results:
            kept = [s for s in splits if generations_path(results, r["group"], r["run"], s).is_file()]
            again = [s for s in splits
                     if s not in kept and reproduction_path(results, r["group"], r["run"], s).is_file()]
            cells.append(("all" if kept == [s for s in splits if s in r["splits"]] else ", ".join(kept) or "no")
                         + (f"; trained again: {', '.join(again)}" if again else ""))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _per(r: dict, split: str, key: str):
    per = r["splits"].get(split, {}).get(key)
    if not per:
        return None
    if key == "per_example" and max(per) <= 1:        # 0/1 scores as points
        per = [100 * x for x in per]
    return per


def comparisons(rows: list[dict], references: Optional[dict] = None, also: Optional[dict] = None) -> list[dict]:
    """Each run against next-token of the same group and seed; per seed, then over seeds by the claim rule. A
    diagnostic group that the plan gives a ``reference`` (``{group: {"group": ..., "methods": [...]}}``,
    :func:`references`) is compared with that group's untagged runs of those methods instead, same seed and
    held-out items. A group with ``also_against`` (``{group: [tag, ...]}``, :func:`also_against`) compares each
    of its untagged runs but next-token's with its tagged next-token runs of those tags and the same seed too (the
    compute check: MuToR against next-token trained for as many tokens). A tagged run is compared with next-token
    of the same tag and seed too, where there is one (MuToR trained for 6 epochs against next-token trained for 6).

    Each comparison: ``mean`` and ``interval`` (:func:`mutor.eval.claims.paired` of the per-example differences
    of each seed), ``holds`` (the rule claims it), ``per_seed`` (seed, mean difference, its per-example s.e.,
    examples), ``scores`` (seed, the run's mean, the baseline's mean), ``rows`` (the rows paired in it, as
    ``(group, run)``: the rows whose readings it is)."""
    base = {(r["group"], r["method"], r["seed"]): r for r in rows if not r["tag"]}
    tagged = defaultdict(list)                     # (group, tag, seed) -> runs: a tag may name runs of several methods
    for r in rows:
        if r["tag"]:
            tagged[(r["group"], r["tag"], r["seed"])].append(r)
    by = defaultdict(list)                         # (group, run label, baseline, split, measure) -> [(seed, diffs)]
    members = defaultdict(set)                     # the same key -> the rows paired in it, (group, run)
    for r in rows:
        ref = (references or {}).get(r["group"])
        targets = [(ref["group"], m) for m in ref["methods"]] if ref else [(r["group"], "next_token")]
        pairs = [(base.get((g, m, r["seed"])), m if g == r["group"] else f"{m} [{g}]") for g, m in targets]
        tags = [r["tag"]] if r["tag"] else (also or {}).get(r["group"], [])   # own tag: next-token of the same budget
        pairs += [(b, label(b)) for t in tags for b in tagged[(r["group"], t, r["seed"])]
                  if b["method"] == "next_token" != r["method"]]
        name = label(r)
        for b, baseline in pairs:
            if b is None or b is r:
                continue
            for split in r["splits"]:
                for measure, key in MEASURES.items():
                    x, y = _per(r, split, key), _per(b, split, key)
                    if x is not None and y is not None and len(x) == len(y):
                        key = (r["group"], name, baseline, split, _measure(r, measure))
                        by[key].append((r["seed"], [p - q for p, q in zip(x, y)], sum(x) / len(x), sum(y) / len(y)))
                        members[key] |= {(r["group"], r["run"]), (b["group"], b["run"])}
    out = []
    for (group, name, baseline, split, measure), seeds in sorted(by.items()):
        seeds = sorted(seeds)
        iv = paired(per_example=[d for _, d, _, _ in seeds])
        out.append({"group": group, "comparison": f"{name} - {baseline}", "baseline": baseline, "split": split,
                    "measure": measure, "per_seed": [(sd, *_mean_se(d), len(d)) for sd, d, _, _ in seeds],
                    "mean": iv.mean, "interval": iv, "holds": iv.holds, "seeds": iv.seeds,
                    "scores": [(sd, x, y) for sd, _, x, y in seeds],     # per seed: the run's and the baseline's mean
                    "rows": sorted(members[(group, name, baseline, split, measure)])})
    return out


def _higher_is_better(c: dict) -> bool:
    return "loss" not in c["measure"]


def _interval(c: dict) -> str:
    """The comparison's mean with its 95 % interval, in the digits the interval supports."""
    return format_interval(c["interval"])


def comparison_table(comps: list[dict]) -> str:
    """One row per group, comparison, split and measure (the group first: many groups compare the same methods):
    each seed's mean difference, the mean over seeds with its 95 % interval, which interval is shown (the
    t-interval over seeds or the per-example one, the wider) and the reading by the claim rule."""
    out = ["| group | comparison | split | measure | seeds | per seed | mean [95 % interval] | interval from | "
           "reading |", "|---|---|---|---|---|---|---|---|---|"]
    for c in comps:
        d = decimals(c["interval"].half)
        per = ", ".join(f"{m:+.{d}f}" for _, m, _, _ in c["per_seed"])
        out.append(f"| {c['group']} | {c['comparison']} | {c['split']} | {c['measure']} | {c['seeds']} | {per} | "
                   f"{_interval(c)} | {c['interval'].source or '-'} | {reading(c)} |")
    return "\n".join(out)


def reading(c: dict) -> str:
    """A comparison in words, by the claim rule (:func:`mutor.eval.claims.reading`): better or worse than the
    baseline, not shown (the interval includes 0), or exploratory (fewer than three seeds)."""
    than = "next-token" if c["baseline"] == "next_token" else c["baseline"]
    return claim_reading(c["interval"], _higher_is_better(c), than)


def two_se_differences(comps: list[dict]) -> list[str]:
    """The comparisons of three seeds or more that reading a difference "beyond two standard errors" (of the mean
    over seeds, ``s / sqrt(n)``) would read otherwise than the claim rule does, one line each with both readings."""
    out = []
    for c in comps:
        iv = c["interval"]
        if iv.exploratory or math.isnan(iv.seed_half):
            continue
        se = iv.seed_half / t_critical(iv.seeds - 1)
        if (abs(iv.mean) > 2 * se) != iv.holds:
            out.append(f"{c['group']}, {c['comparison']}, {c['split']}, {c['measure']}: {_interval(c)} (mean "
                       f"{iv.mean:+.2f}, standard error {se:.2f}): the claim rule reads {reading(c)}; beyond 2 s.e. "
                       f"it would {'' if abs(iv.mean) > 2 * se else 'not '}be claimed")
    return out


def verdict(comps: list[dict], uninformative: Optional[dict] = None) -> str:
    """One line per comparison and split: its mean with the 95 % interval and the reading, in words; for a group
    the plan marks ``uninformative`` (its runs learned nothing a comparison could tell apart), the reason after it."""
    lines = []
    for c in comps:
        reason = (uninformative or {}).get(c["group"])
        lines.append(f"- {c['group']}, {c['comparison']}, {c['split']}, {c['measure']}: {_interval(c)}: "
                     f"{reading(c)}" + (f"; **uninformative**: {reason}" if reason else ""))
    return "\n".join(lines)


def _means(c: dict) -> tuple[float, float]:
    """The baseline's and the run's mean over the seeds paired."""
    return (sum(y for _, _, y in c["scores"]) / len(c["scores"]), sum(x for _, x, _ in c["scores"]) / len(c["scores"]))


def summary_table(comps: list[dict], uninformative: Optional[dict] = None) -> str:
    """Every comparison on its group's primary score (exact match, a star graph's solve rate), in the order
    given: both sides' mean over the seeds paired, the paired difference with its 95 % interval, and its reading
    (an uninformative group's reading says so); answer losses stay in the full table."""
    out = ["| group | split | comparison | seeds | baseline % | run % | difference [95 % interval] | reading |",
           "|---|---|---|---|---|---|---|---|"]
    for c in comps:
        if "loss" in c["measure"]:
            continue
        base, run = _means(c)
        what = "uninformative (floor)" if (uninformative or {}).get(c["group"]) else reading(c)
        out.append(f"| {c['group']} | {c['split']} | {c['comparison']} | {c['seeds']} | {base:.1f} | {run:.1f} | "
                   f"{_interval(c)} | {what} |")
    return "\n".join(out)


def task_table(comps: list[dict], tasks: list[dict], uninformative: Optional[dict] = None,
               method: str = "mutor") -> str:
    """Each task at every budget it was run, side by side (the plan's ``tasks`` block, in its order): the seeds
    paired, next-token's and the method's mean, the method minus next-token with its 95 % interval, and the
    reading. An entry names its ``group``, ``task`` and ``budget``, and optionally the ``split`` (default
    ``test``) and the ``comparison`` (default ``"<method> - next_token"``); an entry of ``method`` ``mutor`` with
    its own comparison is left out of another method's table. Entries without a matching comparison are left out."""
    primary = {(c["group"], c["comparison"], c["split"]): c for c in comps if "loss" not in c["measure"]}
    name = {"mutor": "MuToR", "multi_token": "Multi-Token"}.get(method, method)
    out = [f"| task | budget | seeds | next-token % | {name} % | {name} − next-token, points [95 % interval] | "
           "reading |", "|---|---|---|---|---|---|---|"]
    for t in tasks:
        if "comparison" in t and method != "mutor":
            continue
        c = primary.get((t["group"], t.get("comparison", f"{method} - next_token"), t.get("split", "test")))
        if c is None:
            continue
        base, run = _means(c)
        what = "uninformative (constant-answer floor)" if (uninformative or {}).get(c["group"]) else reading(c)
        out.append(f"| {t['task']} | {t['budget']} | {c['seeds']} | {base:.1f} | {run:.1f} | {_interval(c)} | {what} |")
    return "\n".join(out)


def plot(comps: list[dict], path: str, uninformative: Optional[dict] = None) -> None:
    """Paired differences per comparison with their 95 % intervals: blue with three seeds or more, grey with
    fewer (exploratory); an uninformative group's label says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = sorted({c["measure"] for c in comps}, key=lambda m: ("loss" in m, m))   # the scores, then losses
    counts = [sum(c["measure"] == m for c in comps) for m in measures]
    fig, axes = plt.subplots(len(measures), 1, figsize=(10, 0.28 * sum(counts) + 1.1 * len(measures)), squeeze=False,
                             gridspec_kw={"height_ratios": [n + 2 for n in counts]})   # one panel a measure, stacked
    for ax, measure in zip(axes[:, 0], measures):
        cs = [c for c in comps if c["measure"] == measure]
        labels = [f"{c['group']}: {c['comparison']} [{c['split']}]"
                  + (" (uninformative)" if c["group"] in (uninformative or {}) else "") for c in cs]
        for i, c in enumerate(cs):
            iv: Interval = c["interval"]
            err = [[iv.mean - iv.low], [iv.high - iv.mean]] if iv.source else None
            ax.errorbar(iv.mean, i, xerr=err, fmt="o", color="C0" if not iv.exploratory else "0.6", capsize=3)
            for sd, m, _, _ in c["per_seed"]:
                ax.plot(m, i, "x", color="C1", ms=4)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_yticks(range(len(cs)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()                                                          # read top-down
        ax.set_xlabel(f"difference in {measure}\n(o: mean with its 95 % interval, grey: fewer than 3 seeds; x: seeds)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _degree(row: dict) -> Optional[int]:
    """A star-graph run's degree, from its recipe with the group's overrides (None: the recipe sets none)."""
    from mutor.run.recipe import load_recipe

    return (load_recipe(row["recipe"], row.get("overrides")).data or {}).get("degree")


def curves(rows: list[dict], path: str) -> bool:
    """The evaluations logged during training (``per_checkpoint`` with ``eval_step``: star graphs), one panel per
    group and measure (solve rate, first hop), a line per run: colour by method, line style by seed; a dotted
    line at 1/degree, the "Clever Hans" plateau (guessing the first hop). Returns whether any group had such
    a curve (no file otherwise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if any("eval_step" in h for h in r.get("per_checkpoint") or []):
            groups[r["group"]].append(r)
    if not groups:
        return False
    measures = ["solve_rate", "first_hop"]
    fig, axes = plt.subplots(len(groups), len(measures), figsize=(6 * len(measures), 3.6 * len(groups)), squeeze=False)
    colours = {"next_token": "C0", "mutor": "C3", "multi_token": "C2"}
    for row_axes, (group, rs) in zip(axes, sorted(groups.items())):
        degree = _degree(rs[0])
        for ax, m in zip(row_axes, measures):
            for r in sorted(rs, key=lambda r: (r["method"], r["seed"])):
                pts = [(h["eval_step"], 100 * h[f"eval_{m}"]) for h in r["per_checkpoint"] if f"eval_{m}" in h]
                if pts:
                    ax.plot(*zip(*pts), color=colours.get(r["method"], "0.4"), ls=["-", "--", ":"][r["seed"] % 3],
                            marker="o", ms=3, label=f"{r['method']} s{r['seed']}")
            if degree:
                ax.axhline(100 / degree, color="0.5", ls=":", lw=1, label=f"1/degree ({100 / degree:.0f} %)")
            ax.set_title(f"{group}: {m} (held-out, %)", fontsize=9)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def glance(rows: list[dict], comps: list[dict], uninformative: Optional[dict] = None,
           tasks: Optional[list[dict]] = None) -> str:
    """The at-a-glance table with its caption: with the plan's ``tasks`` block, MuToR against next-token for each
    task at every budget it was run (:func:`task_table`); without one, every comparison of ``comps``
    (:func:`comparisons` of ``rows``) on its primary score, groups in the rows' order."""
    if tasks:
        return ("MuToR against next-token, each task at every budget it was run; the mean over the seeds paired, "
                "the difference with its 95 % interval, read by the claim rule (fewer than three seeds: "
                "exploratory; an uninformative task scores at its constant-answer floor):\n\n"
                + task_table(comps, tasks, uninformative))
    order = {g: i for i, g in enumerate(dict.fromkeys(r["group"] for r in rows))}
    comps = sorted(comps, key=lambda c: order[c["group"]])                      # stable within a group
    return ("At a glance: each comparison on its group's primary score, the mean over the seeds paired (per-run "
            "and per-seed numbers with every row; an uninformative group scores at its constant-answer floor; "
            "a difference is read by the claim rule):\n\n" + summary_table(comps, uninformative))


def answers_line(rows: list[dict], results: Path) -> str:
    """How many run x split results have their scored answers committed beside the results file, and how many
    more have those of a reproduction instead (the runs tables' last column, counted)."""
    splits = [(r["group"], r["run"], s) for r in rows for s in r["splits"]]
    kept = sum(generations_path(results, *x).is_file() for x in splits)
    again = sum(not generations_path(results, *x).is_file() and reproduction_path(results, *x).is_file()
                for x in splits)
    return (f"Scored answers are committed for {kept} of the {len(splits)} run x split results below (the runs "
            f"tables' last column), and for {again} more those of the run trained again.")


def markdown(rows: list[dict], uninformative: Optional[dict] = None, references: Optional[dict] = None,
             with_glance: bool = True, comps: Optional[list[dict]] = None, tasks: Optional[list[dict]] = None,
             results: Optional[Path] = None) -> str:
    """The rows as markdown: the at-a-glance table (unless ``with_glance`` is off: a file holds it apart), with the
    plan's ``tasks`` the same table for Multi-Token, each group's runs, the paired differences and their readings;
    ``comps``: :func:`comparisons` of the rows, when the caller has them already; ``results``: the results file,
    whose committed answers the runs' tables mark (:func:`runs_table`)."""
    parts = [answers_line(rows, results)] if results else []
    for group in dict.fromkeys(r["group"] for r in rows):
        g = [r for r in rows if r["group"] == group]
        parts.append(f"**{group}** ({g[0]['recipe']}; {g[0]['selection']})\n\n{runs_table(g, results)}")
    comps = comparisons(rows, references) if comps is None else comps
    if not comps:
        parts.append("No paired comparison yet: no run of another method has a next-token run of the same group "
                     "and seed beside it.")
        return "\n\n".join(parts)
    if tasks:
        multi = task_table(comps, tasks, uninformative, method="multi_token")
        if len(multi.splitlines()) > 2:
            parts.insert(0, "Multi-Token against next-token, each task at every budget it was run (as the "
                            "at-a-glance table for MuToR):\n\n" + multi)
    if with_glance:
        parts.insert(0, glance(rows, comps, uninformative, tasks))
    parts.append("Paired differences against next-token (same seed, same held-out examples; a diagnostic group against "
                 "the runs of its reference group named in brackets), each with its 95 % interval (from the seeds or "
                 "the examples, the wider) and its reading by the claim rule:\n\n" + comparison_table(comps))
    parts.append("Readings, generated from the rows:\n\n" + verdict(comps, uninformative))
    return "\n\n".join(parts)


def drafting_table(drafts: list[dict]) -> str:
    """Registers as drafters (drafting.jsonl): per MuToR run, greedy tokens/s and, per draft length, tokens
    per forward, tokens/s and the ratio of tokens/s to greedy's (not of seconds: in bf16 an output may differ
    from greedy's and have another length), all at batch size 1 on the same prompts; how busy the machine was
    (other processes' CPU, where recorded) and whether the run was trained again for the measurement."""
    if not drafts:
        return ""
    ks = sorted({k for d in drafts for k in d["drafting"]}, key=lambda k: (k == "K=auto", k))
    head = ["group", "run", "prompts", "dtype", "timing (other processes' CPU, cores)", "drafting code",
            "greedy tok/s"] + \
           [f"{k}: tok/fwd, tok/s, x greedy" for k in ks] + ["acceptance d=2..d_max (longest K)",
                                                              "prompts differing from greedy (most over K)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in drafts:
        timing = "interleaved" if d.get("timing") else "one decoder after another"
        if (d.get("machine") or {}).get("others_cpu_cores") is not None:       # in the rows that record it
            timing += f" ({d['machine']['others_cpu_cores']:.1f})"
        again = d.get("retrained")                                             # driver.py --redraft --retrain
        run = d["run"] + ("" if not again else " (trained again)" if again["reproduced"]
                          else " (trained again, NOT the row's weights)")
        cells = [d["group"], run, str(d["prompts"]), d["dtype"], timing, d.get("drafting_code", d.get("code", "-")),
                 f"{d['greedy']['tokens_per_s']:.1f}"]
        for k in ks:
            r = d["drafting"].get(k)
            cells.append(f"{r['tokens_per_forward']:.2f}, {r['tokens_per_s']:.1f}, "
                         f"{r['tokens_per_s'] / d['greedy']['tokens_per_s']:.2f}x" if r else "-")
        longest = d["drafting"].get(f"K={d['d_max']}", {})
        cells.append(", ".join(f"{v:.2f}" for v in longest.get("acceptance", {}).values()) or "-")
        differ = [r.get("prompts_differing_from_greedy", 0 if r["identical_to_greedy"] else None)
                  for r in d["drafting"].values()]
        cells.append("some (not counted)" if None in differ else str(max(differ)))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _plan(plan: Path) -> dict:
    if not plan.is_file():
        return {}
    from mutor.utils.io import yaml_load

    return yaml_load(plan.read_text(), str(plan))


def _uninformative(plan: Path) -> dict:
    """Group name -> why its comparison says nothing: the plan's ``uninformative`` block (found after the fact)
    and the groups stopped by their own rule (their ``stopped`` key)."""
    p = _plan(plan)
    stopped = {g["name"]: g["stopped"] for g in p.get("groups", []) if g.get("stopped")}
    return {**(p.get("uninformative") or {}), **stopped}


def references(plan: Path) -> dict:
    """Diagnostic groups -> what they are compared with: a group's ``reference`` (``{group, methods}``; a bare group
    name means its next-token runs)."""
    out = {}
    for g in _plan(plan).get("groups", []):
        ref = g.get("reference")
        if ref is not None:
            ref = {"group": ref, "methods": ["next_token"]} if isinstance(ref, str) else ref
            out[g["name"]] = {"group": ref["group"], "methods": list(ref.get("methods", ["next_token"]))}
    return out


def tasks(plan: Path) -> list[dict]:
    """The plan's ``tasks`` block: how the at-a-glance table lays out each task at every budget it was run
    (:func:`task_table`); empty when the plan has none."""
    return list(_plan(plan).get("tasks") or [])


def also_against(plan: Path) -> dict:
    """Groups whose untagged runs are also compared with some of their tagged runs: a group's ``also_against``
    (a list of tags)."""
    return {g["name"]: list(g["also_against"]) for g in _plan(plan).get("groups", []) if g.get("also_against")}


def marks(text: str, begin: str = BEGIN, end: str = END) -> bool:
    """Whether ``text`` holds both markers of a generated block."""
    return begin in text and end in text


def replace_between(text: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    if not marks(text, begin, end):
        raise SystemExit(f"the README has no {begin} ... {end} block")
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.S)


REPRODUCED = ("a row trained and scored again reproduces the committed one when, on every split and measure "
              "compared, its per-example scores are identical to the committed row's, or, where they are not, every "
              "reading the row enters is unchanged with the fresh row in the committed one's place. The readings a "
              "row enters are every paired comparison of this report that pairs it (as the run or as the baseline, "
              "on that split and measure), the comparisons behind the summary tables included; a reading is "
              "unchanged when the claim rule reads it the same (claimed or not, and in which direction, or "
              "exploratory) and its mean difference keeps its sign. The numbers shown may move; the largest move "
              "of a mean difference is shown. A row that enters no reading reproduces only when identical. How many "
              "of the n per-example scores are the same is always reported")
"""The reproduction rule, stated once: ``reproduce.py`` judges by it (:func:`judge`), and the page says it."""


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def entered_readings(rows: list[dict], fresh: dict, split: str, measure: str, references: Optional[dict] = None,
                     also: Optional[dict] = None) -> list[dict]:
    """Every reading the committed row of ``fresh``'s group and run enters on ``split`` and ``measure``, before and
    after ``fresh`` takes its place in ``rows`` (:func:`comparisons`, with the plan's ``references`` and ``also``).

    Returns:
        One dict per comparison that pairs the row: ``group``, ``comparison``, ``before`` and ``after`` (the claim
        rule's reading), ``mean_before`` and ``mean_after`` (the mean differences), ``shown_before`` and
        ``shown_after`` (the interval as the tables write it) and ``changed`` (another reading, or the mean's sign
        flipped)."""
    key = (fresh["group"], fresh["run"])
    groups = {key[0]} | {g for g, ref in (references or {}).items() if ref["group"] == key[0]}
    if key[0] in (references or {}):
        groups.add(references[key[0]]["group"])
    mine = [r for r in rows if r["group"] in groups and "method" in r]
    if len(mine) < 2:
        return []                                           # nothing to pair with
    swapped = [fresh if (r["group"], r["run"]) == key else r for r in mine]
    after = {(c["group"], c["comparison"], c["split"], c["measure"]): c for c in comparisons(swapped, references, also)}
    out = []
    for c in comparisons(mine, references, also):
        if key not in c["rows"] or c["split"] != split or c["measure"] != measure:
            continue
        a = after[(c["group"], c["comparison"], c["split"], c["measure"])]
        out.append({"group": c["group"], "comparison": c["comparison"], "before": reading(c), "after": reading(a),
                    "mean_before": c["mean"], "mean_after": a["mean"], "shown_before": _interval(c),
                    "shown_after": _interval(a),
                    "changed": reading(c) != reading(a) or _sign(c["mean"]) != _sign(a["mean"])})
    return out


def _measure_key(measure: str) -> str:
    """The per-example field behind a measure's name (the score is named by the group's primary metric)."""
    return "answer_loss_per_example" if "loss" in measure else "per_example"


def judge(rows: list[dict], committed: dict, fresh: dict, split: str, measure: str,
          references: Optional[dict] = None, also: Optional[dict] = None) -> dict:
    """One split and measure of a reproduction judged by :data:`REPRODUCED`.

    Args:
        rows: The committed results rows (the readings are theirs).
        committed: The committed row.
        fresh: The row trained and scored again.
        split: The split compared.
        measure: The measure's name, as :func:`comparisons` names it.
        references: The plan's diagnostic references (:func:`references`).
        also: The plan's ``also_against`` (:func:`also_against`).

    Returns:
        ``identical`` (every per-example value equal; for an answer loss without per-example values, the mean),
        ``same_items`` (per-example values equal, None where either side has none), ``n``, ``readings``
        (:func:`entered_readings`), ``moved`` (the largest move of a mean difference), ``changed`` (the changed
        readings in words) and ``status``: ``identical``, ``readings unchanged`` or ``NOT reproduced``.
    """
    key = _measure_key(measure)
    c, f = _per(committed, split, key), _per(fresh, split, key)
    same = sum(a == b for a, b in zip(c, f)) if c is not None and f is not None and len(c) == len(f) else None
    if same is not None:
        identical = same == len(c)
    else:
        sc, sf = committed["splits"].get(split, {}), fresh["splits"].get(split, {})
        identical = sc.get("answer_loss") == sf.get("answer_loss") if "loss" in measure else False
    found = entered_readings(rows, fresh, split, measure, references, also)
    changed = [f"{x['group']}: {x['comparison']}: {x['before']} ({x['shown_before']}) -> {x['after']} "
               f"({x['shown_after']})" for x in found if x["changed"]]
    status = "identical" if identical else "readings unchanged" if found and not changed else "NOT reproduced"
    return {"identical": identical, "same_items": same, "n": len(c) if c is not None else None, "readings": found,
            "moved": max((abs(x["mean_after"] - x["mean_before"]) for x in found), default=0.0),
            "changed": changed, "status": status}


def _primary_scores(path: Path, primary: str) -> Optional[list[float]]:
    """The per-example primary scores of kept generations (``<split>.jsonl.gz``), in points (None when absent)."""
    import gzip

    if not path.is_file():
        return None
    with gzip.open(path, "rt") as f:
        xs = [float(json.loads(x)[primary]) for x in f if x.strip()]
    return [100 * x for x in xs] if xs and max(xs) <= 1 else xs


def fresh_row(results: Path, committed: dict, record: dict) -> tuple[Optional[dict], list[str]]:
    """The fresh row of a recorded reproduction, rebuilt to judge it by :data:`REPRODUCED` against the rows as they
    are now: the row ``reproduce.py --record`` keeps under ``reproductions/<group>/<run>/row.json``; for a
    reproduction recorded without it, the committed row with each compared split's per-example scores read from
    the fresh answers kept there. A fresh answer loss without its per-example values is stood in for by the
    committed per-example losses shifted by the recorded difference: the same means and intervals over seeds, the
    committed row's spread per example.

    Returns:
        The fresh row (None when neither is kept) and notes on what was stood in for.
    """
    kept = reproduction_row_path(results, record["group"], record["run"])
    if kept.is_file():
        return json.loads(kept.read_text()), []
    fresh = json.loads(json.dumps(committed))
    notes = []
    for x in record["lines"]:
        sp = fresh["splits"].get(x["split"])
        if sp is None:
            return None, []
        if "loss" in x["measure"]:
            if x["difference"] and sp.get("answer_loss_per_example"):
                sp["answer_loss_per_example"] = [v + x["difference"] for v in sp["answer_loss_per_example"]]
                notes.append(f"{x['split']} answer loss: the committed per-example losses shifted by the recorded "
                             "difference")
            sp["answer_loss"] = x["fresh"]
            continue
        if x.get("same_items") == x.get("n"):
            continue                                         # identical: the committed scores are the fresh ones
        scores = _primary_scores(reproduction_path(results, record["group"], record["run"], x["split"]),
                                 committed.get("primary", "accuracy"))
        if scores is None or len(scores) != len(sp.get("per_example") or []):
            return None, []
        sp["per_example"] = scores
    return fresh, notes


def _decimals(committed: Optional[dict], line: dict) -> int:
    """The decimals a compared value supports: those of the committed value's 95 % per-example half-width."""
    sp = (committed or {}).get("splits", {}).get(line["split"], {})
    if "loss" in line["measure"]:
        half = t_critical(max(1, (sp.get("n") or 2) - 1)) * (sp.get("answer_loss_se") or 0.0)
    else:
        per = _per(committed, line["split"], "per_example") if committed else None
        half = t_critical(len(per) - 1) * _mean_se(per)[1] if per and len(per) > 1 else line.get("tolerance")
    return decimals(half, default=1)


def rejudged(results: Path, rows: list[dict], records: list[dict], references: Optional[dict] = None,
             also: Optional[dict] = None) -> list[dict]:
    """Every recorded reproduction judged again by :data:`REPRODUCED` against the rows as they are now (a verdict
    recorded before the rule, or before rows it enters were added, is not taken as it was): per record, its
    ``lines`` with ``verdict`` (:func:`judge`'s, or ``not comparable`` for a run trained in another precision,
    or ``not judged`` when the fresh scores are not kept) and ``notes``."""
    by = {(r["group"], r["run"]): r for r in rows}
    out = []
    for rec in records:
        committed = by.get((rec["group"], rec["run"]))
        same = rec.get("same_precision", True)
        fresh, notes = fresh_row(results, committed, rec) if committed and same else (None, [])
        lines = []
        for x in rec["lines"]:
            j = judge(rows, committed, fresh, x["split"], x["measure"], references, also) if fresh else None
            if not same:
                verdict = "not comparable: " + rec["precision"]
            elif j is None:
                verdict = "not judged: the committed row or the fresh scores are not kept"
            else:
                verdict = j["status"]
            lines.append({**x, "judged": j, "verdict": verdict})
        stale = committed is not None and rec.get("committed_finished_at") not in (None, committed.get("finished_at"))
        out.append({**rec, "lines": lines, "notes": notes, "committed": committed, "stale": stale})
    return out


def _readings_cell(j: Optional[dict], d: int) -> str:
    if j is None:
        return "-"
    if not j["readings"]:
        return "none"
    n = len(j["readings"])
    if j["changed"]:
        return f"{n}; changed: " + "; ".join(j["changed"])
    return f"{n}, unchanged" + ("" if j["identical"] else f" (means moved by {j['moved']:.{d}f} at most)")


def reproductions_table(rows: list[dict], committed: list[dict] = (), judged: bool = False) -> str:
    """Rows trained and scored again (``reproduce.py --record``): per split and measure, the committed and the
    fresh value, their difference, how many per-example scores are the same, the readings the row enters with
    what the fresh row does to them, the verdict by :data:`REPRODUCED` (none where the fresh run trained in
    another precision), and the code and training threads of both runs (a row recorded without the committed
    thread count takes it from ``committed``, the committed results rows). ``rows``: :func:`rejudged`'s records
    with ``judged``, else the records as kept (their recorded verdicts)."""
    threads = {(c["group"], c["run"]): c for c in committed}
    out = ["| group | run | split | measure | committed | fresh | difference | same per-example scores | "
           "readings the row enters | verdict | code (committed, fresh) | threads (committed, fresh) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["group"], r["run"])):
        row = r.get("committed") or threads.get((r["group"], r["run"]))
        both = (r.get("committed_threads") or (row or {}).get("threads"), r.get("threads"))
        for x in r["lines"]:
            d = _decimals(row, x)
            same = "-" if x["same_items"] is None else f"{x['same_items']}/{x['n']}"
            j = x.get("judged")
            if judged:
                verdict = x["verdict"]
            else:
                verdict = x["status"] if r.get("same_precision", True) else "not comparable: " + r["precision"]
            out.append(f"| {r['group']} | {r['run']} | {x['split']} | {x['measure']} | {x['committed']:.{d}f} | "
                       f"{x['fresh']:.{d}f} | {x['difference']:+.{d}f} | {same} | {_readings_cell(j, d)} | "
                       f"{verdict} | {r.get('committed_code') or '?'}, {r.get('code') or '?'} | "
                       f"{', '.join(str(t or '?') for t in both)} |")
    return "\n".join(out)


def reproductions_summary(judged: list[dict]) -> str:
    """The rejudged reproductions in one paragraph: how many rows, how many identical, how many with every reading
    unchanged, not reproduced, not comparable or not judged; the per-example agreement of those not identical;
    what was stood in for."""
    verdicts = {}
    for r in judged:
        vs = [x["verdict"] for x in r["lines"]]
        v = ("not comparable" if any(x.startswith("not comparable") for x in vs) else
             "not judged" if any(x.startswith("not judged") for x in vs) else
             "NOT reproduced" if "NOT reproduced" in vs else
             "identical" if all(x == "identical" for x in vs) else "readings unchanged")
        verdicts.setdefault(v, []).append(r)
    parts = [f"{len(v)} {k}" for k, v in (("identical", verdicts.get("identical", [])),
                                          ("not identical with every reading unchanged",
                                           verdicts.get("readings unchanged", [])),
                                          ("NOT reproduced", verdicts.get("NOT reproduced", [])),
                                          ("not comparable", verdicts.get("not comparable", [])),
                                          ("not judged", verdicts.get("not judged", []))) if v]
    text = f"By this rule, of the {len(judged)} rows trained again: " + ", ".join(parts) + "."
    agree = [(x["same_items"], x["n"]) for r in verdicts.get("readings unchanged", []) + verdicts.get(
        "NOT reproduced", []) for x in r["lines"] if x["same_items"] is not None and x["same_items"] != x["n"]]
    if agree:
        lo, hi = min(agree, key=lambda a: a[0] / a[1]), max(agree, key=lambda a: a[0] / a[1])
        text += f" Where not identical, {lo[0]}/{lo[1]} to {hi[0]}/{hi[1]} per-example scores are the same."
    stood = sorted({f"{r['group']}/{r['run']}" for r in judged if r["notes"]})
    if stood:
        text += (" The fresh per-example answer losses of " + ", ".join(stood) + " were not kept (recorded before "
                 "`reproduce.py` kept the fresh row): their answer-loss readings are judged with the committed "
                 "per-example losses shifted by the recorded difference, which gives the same means and intervals "
                 "over seeds and the committed row's spread per example.")
    stale = sorted(f"{r['group']}/{r['run']}" for r in judged if r["stale"])
    if stale:
        text += " The committed row of " + ", ".join(stale) + " was replaced after its reproduction."
    return text


def first_hop_table(hops: list[dict]) -> str:
    """The registers on the first hop (first_hop.jsonl): per star-graph MuToR run, the next-token head's and each
    register offset's teacher-forced first-hop accuracy, and on the graphs whose arms start with different
    tokens the first token's, with how often the register names an arm at all."""
    offsets = sorted({k.split("_")[0] for h in hops for k in h if k.startswith("d=")}, key=lambda k: int(k[2:]))
    out = ["| group | run | graphs | first hop right: ntp, " + ", ".join(offsets) + " | graphs split by first token "
           "| first token right: ntp, " + ", ".join(offsets) + " | register names an arm: " + ", ".join(offsets) + " |",
           "|---|---|---|---|---|---|---|"]
    pct = lambda h, keys: ", ".join("-" if h.get(k) is None else f"{100 * h[k]:.1f}" for k in keys)  # noqa: E731
    for h in sorted(hops, key=lambda h: (h["group"], h["seed"], h["run"])):
        out.append(f"| {h['group']} | {h['run']} | {h['graphs']} | {pct(h, ['ntp', *offsets])} | "
                   f"{h['graphs_arms_split_by_first_token']} | "
                   f"{pct(h, ['ntp_first_token', *(f'{d}_first_token' for d in offsets)])} | "
                   f"{pct(h, [f'{d}_an_arm' for d in offsets])} |")
    return "\n".join(out)


def grad_share_table(rows: list[dict]) -> str:
    """How much of a MuToR run's AdamW step goes to next-token prediction (grad_share.jsonl), per checkpoint."""
    out = ["| group | run | checkpoint | a | gradient norm: (1-a)·L_ntp, a·L_reg "
           "| cosine (mean gradients; per batch) "
           "| next-token part of the step / next-token training's | whole step along next-token's |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['group']} | {r['run']} | {r['checkpoint']} | {r['loss_weight']} | {r['ntp_grad_norm']:.3f}, "
                   f"{r['reg_grad_norm']:.3f} | {r['cosine']:+.2f}; {r['batch_cosine']:+.2f} "
                   f"| {r['ntp_step_ratio']:.2f} | {r['step_along_ntp']:.2f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results.jsonl")
    ap.add_argument("--plan", type=Path, default=HERE / "plan.yaml",
                    help="its `uninformative` groups are marked, its groups' `reference` and `also_against` followed, "
                         "its `tasks` block lays out the at-a-glance table")
    ap.add_argument("--readme", nargs="+", default=[], metavar="FILE",
                    help=f"write the generated blocks where these files mark them: the rows between {BEGIN} and "
                         f"{END} (one file must have them), the at-a-glance table between {GLANCE[0]} and "
                         f"{GLANCE[1]} (if no file has those, it opens the rows' block)")
    ap.add_argument("--plot", default=None, help="paired differences of the method comparisons (PNG)")
    ap.add_argument("--curves", default=None, help="evaluations during training, star-graph groups (PNG)")
    ap.add_argument("--against-two-se", action="store_true",
                    help="print only the comparisons of three seeds or more that reading a difference beyond two "
                         "standard errors of the seeds' mean would read otherwise than the claim rule, and their count")
    args = ap.parse_args(argv)
    rows = load(args.results)
    if not rows:
        print(f"{args.results}: no rows yet")
        return 0
    marked, refs, layout = _uninformative(args.plan), references(args.plan), tasks(args.plan)
    if args.against_two_se:
        comps = comparisons(rows, refs, also_against(args.plan))
        differ = two_se_differences(comps)
        many = sum(not c["interval"].exploratory for c in comps)
        print(f"{len(differ)} of {many} comparisons of three seeds or more read otherwise beyond 2 s.e.:"
              + "".join(f"\n- {x}" for x in differ))
        return 0
    texts = {Path(f): Path(f).read_text() for f in args.readme}
    if texts and not any(marks(t) for t in texts.values()):
        raise SystemExit(f"none of {', '.join(map(str, texts))} has a {BEGIN} ... {END} block")
    apart = any(marks(t, *GLANCE) for t in texts.values())     # the summary has a place of its own
    comps = comparisons(rows, refs, also_against(args.plan))  # the tables, the glance and the plot share them
    md = markdown(rows, marked, refs, with_glance=not apart, comps=comps, tasks=layout, results=args.results)
    drafts = latest_drafts(load(args.results.with_name("drafting.jsonl")))
    if drafts:
        md += ("\n\nRegisters as drafters on each MuToR run's selected checkpoint (experiments/evidence/drafting.py: "
               "the first test prompts, batch size 1, one thread, greedy and drafting in one process, beside the "
               "training runs unless the timing column shows other processes' CPU near 0 (where the row records it; "
               "1-2 cores: beside one or two trainings, or beside one other measurement where the trainings were "
               "paused to measure two runs at once); K=1 is plain decoding on the drafting code path, K=auto picks "
               "each round's draft length and whether registers follow every fed token or the last one only; x greedy "
               "is the ratio of tokens per second; a run measured again (newer drafting code, a quiet machine; trained "
               "again where its checkpoints were gone, `driver.py --redraft --retrain`) shows its latest row; a prompt "
               "can differ from greedy only in bfloat16, by rounding):\n\n" + drafting_table(drafts))
    again = load(args.results.with_name("reproductions.jsonl"))
    if again:
        judged = rejudged(args.results, rows, again, refs, also_against(args.plan))
        md += ("\n\nRows trained and scored again from their plan entries (`reproduce.py GROUP/RUN --record`, into a "
               "scratch directory, with the committed row's thread count unless `--threads` gives another, shown in "
               "the table's last column; their answers are under `experiments/evidence/reproductions/`), each judged "
               "here against the rows as they are now: " + REPRODUCED + ". A run trained in another precision than "
               "the row's (a CPU without fast bf16 trains a bf16 recipe in float32) is not comparable. "
               + reproductions_summary(judged) + "\n\n" + reproductions_table(judged, rows, judged=True))
    hops = load(args.results.with_name("first_hop.jsonl"))
    if hops:
        md += ("\n\nThe registers on the first hop, the star graph's one step that needs planning "
               "(experiments/evidence/first_hop.py: teacher-forced on the run's held-out graphs, in %; "
               "a register d tokens back sees the "
               "source and no token of the hop; a coin flip between two arms scores 50):\n\n" + first_hop_table(hops))
    shares = load(args.results.with_name("grad_share.jsonl"))
    if shares:
        md += ("\n\nHow much of MuToR's step goes to next-token prediction (experiments/evidence/grad_share.py: the "
               "gradients of (1-a)·L_ntp and a·L_reg on the model's weights over 8 training batches of 4 at the "
               "checkpoint, and the next-token part of an Adam step normalised by both, against the step next-token "
               "training would take at the same weights; 1.0 = the same step):\n\n" + grad_share_table(shares))
    print(md)
    for path, text in texts.items():                           # each block where its markers are
        new = text
        if marks(text, *GLANCE):
            new = replace_between(new, glance(rows, comps, marked, layout), *GLANCE)
        if marks(text):
            new = replace_between(new, md)
        if new != text:
            path.write_text(new)
    if args.plot:
        # the method comparisons; a diagnostic group's (tables and readings above) would set the scale
        plot([c for c in comps if c["group"] not in refs], args.plot, marked)
    if args.curves and not curves(rows, args.curves):
        print(f"no run with evaluations during training yet: {args.curves} not written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
