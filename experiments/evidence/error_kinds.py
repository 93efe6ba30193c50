"""Where a list-answer reasoning group's runs go wrong: the kinds of wrong answers, per method, over seeds.

The answers of word reversal ("if, simple, the") and number sorting (``['-95.79', '56.0']``) are lists, so a wrong
answer is one of a few kinds, told apart by comparing the predicted items with the reference's:

* ``order``: the same items (as a multiset), in another order: the plan went wrong;
* ``item changed``: as many items, but some differ: an item was not copied exactly (``turning`` -> ``turned``,
  ``Most`` -> ``most``, ``56.0`` -> ``56``);
* ``item dropped`` / ``item added``: fewer or more items than the reference;
* ``no list``: nothing parsed as a list.

With ``--words`` the items are an answer's words as written (split at spaces): sentence reordering's answers
("Smith, turning to a second scientist."), whose shuffled prompt keeps each word's punctuation and case, so a
right set of words in another order is ``order``, and a word the model changed, dropped or added is one of the
other kinds.

It reads each run's test generations at its selected checkpoint (the results row says which), so it measures
what the table scores, and also prints exact match by the number of items in the reference: the gzipped copy the
driver commits beside the results file (``generations/<group>/<run>/test.jsonl.gz``), or, for a row older than
that, the run directory under ``--runs-dir``.

    python experiments/evidence/error_kinds.py rg-word-reversal [--runs-dir /work/runs/evidence]
    python experiments/evidence/error_kinds.py rg-sentence-reordering-3ep --words
    python experiments/evidence/error_kinds.py rg-number-sorting-3ep --seeds 2     # the seeds still kept
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import report  # same folder: the results file and run labels as the report reads them

HERE = Path(__file__).resolve().parent
KINDS = ("right", "order", "item changed", "item dropped", "item added", "no list")


def items(answer: str, words: bool = False):
    """The list in an answer: a Python list literal (number sorting) or comma-separated words; None if neither.
    ``words``: the answer's words, split at spaces."""
    text = (answer or "").strip()
    if not text:
        return None
    if words:
        return text.split()
    if text.startswith("["):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
        return [str(x).strip() for x in value] if isinstance(value, list) else None
    return [w.strip() for w in text.split(",")]


def kind(prediction: str, reference: str, words: bool = False) -> str:
    """The kind of one answer (module docstring)."""
    got, ref = items(prediction, words), items(reference, words)
    if got is None:
        return "no list"
    if got == ref:
        return "right"
    if len(got) == len(ref):
        return "order" if Counter(got) == Counter(ref) else "item changed"
    return "item dropped" if len(got) < len(ref) else "item added"


def generations(row: dict, runs_dir: Path, results: Path = HERE / "results.jsonl") -> list[dict]:
    """A run's test generations at its selected checkpoint: the copy kept beside the results file (the driver
    writes one with each row), else the run directory's."""
    kept = report.generations_path(results, row["group"], row["run"], "test")
    if kept.is_file():
        with gzip.open(kept, "rt") as f:
            return [json.loads(x) for x in f if x.strip()]
    gens = (runs_dir / row["group"] / row["run"] / "eval" / row["task"] / row["selected_checkpoint"] / "test"
            / "generations.jsonl")
    if not gens.is_file():
        raise SystemExit(f"{row['group']}/{row['run']}: neither {kept} nor {gens} exists: is --runs-dir the runs' "
                         "directory (and the run evaluated)? A row without a kept copy has its generations only there "
                         "(reproduce.py writes them again into a scratch directory)")
    return [json.loads(x) for x in gens.read_text().splitlines() if x.strip()]


def tally(rows: list[dict], runs_dir: Path, words: bool = False, results: Path = HERE / "results.jsonl") -> dict:
    """Per method label: counts of each kind, and (right, total) by the reference's number of items."""
    out = defaultdict(lambda: {"kinds": Counter(), "by_items": defaultdict(lambda: [0, 0]), "runs": 0})
    for r in rows:
        t = out[report.label(r)]
        t["runs"] += 1
        for g in generations(r, runs_dir, results):
            k = kind(g["extracted"], g["reference"], words)
            t["kinds"][k] += 1
            n = len(items(g["reference"], words))
            t["by_items"][n][0] += k == "right"
            t["by_items"][n][1] += 1
    return out


def table(tallies: dict) -> str:
    lengths = sorted({n for t in tallies.values() for n in t["by_items"]})
    out = ["| method | runs | answers | " + " | ".join(KINDS) + " | EM % by items: "
           + ", ".join(map(str, lengths)) + " |",
           "|---|---|---|" + "---|" * (len(KINDS) + 1)]
    for label, t in tallies.items():
        total = sum(t["kinds"].values())
        by = ", ".join(f"{100 * t['by_items'][n][0] / t['by_items'][n][1]:.0f}" if t["by_items"][n][1] else "-"
                       for n in lengths)
        kinds = " | ".join(str(t["kinds"][k]) for k in KINDS)
        out.append(f"| {label} | {t['runs']} | {total} | {kinds} | {by} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("group", help="a reasoning group of the plan with list answers, e.g. rg-word-reversal")
    ap.add_argument("--results", type=Path, default=HERE / "results.jsonl")
    ap.add_argument("--runs-dir", type=Path, default=HERE.parent.parent / "runs" / "evidence")
    ap.add_argument("--words", action="store_true", help="items are the answer's words (sentence reordering)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="only these seeds (e.g. those whose "
                    "generations are still kept, for every method alike)")
    args = ap.parse_args(argv)
    rows = [r for r in report.load(args.results) if r["group"] == args.group
            and (args.seeds is None or r["seed"] in args.seeds)]
    if not rows:
        raise SystemExit(f"{args.results}: no row of group {args.group!r}"
                         + (f" with seeds {args.seeds}" if args.seeds is not None else ""))
    print(table(tally(rows, args.runs_dir, args.words, args.results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
