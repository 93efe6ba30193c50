"""Train and score one evidence row again, into a scratch directory, and print it beside the committed row.

    python experiments/evidence/reproduce.py rg-word-reversal/mutor_s0
    python experiments/evidence/reproduce.py gsm-smollm2-lora/next_token_s1 --split test --scratch /tmp/repro

The run is trained and scored by the driver's own stages (``driver.py``'s :meth:`Driver.train_and_score` and
:meth:`Driver.row`: the plan's recipe, overrides, seed, budget and evaluation protocol), with the committed row's
thread count, into ``--scratch`` (default ``runs/reproduce``, ignored by git): the run directory under
``runs/``, the fresh row in ``results.jsonl`` and its scored generations under ``generations/``. Nothing in the
checkout changes, and nothing is committed. A scratch directory that already holds the finished run is scored
again without training; delete it to train again. Only the results row is reproduced, not the drafting or
first-hop rows. Reproductions side by side each need their own ``--scratch``; they may ``--record`` into the same
checkout.

What counts as reproduced is stated once, in ``report.py``'s ``REPRODUCED``, and judged by its ``judge`` (exit
status 0 when every split and measure compared holds, 1 otherwise): the per-example scores are ``identical`` (what
the kind of CPU the row was trained on gives, with its thread count and library versions: the same seed, data order
and summation order give the same weights, to the last bit); or they are not, and every reading the row enters is
the same with the fresh row in the committed one's place (``readings unchanged``): each paired comparison of
``report.py`` that pairs the row, with the plan's references and ``also_against``, is read the same by the claim
rule (claimed or not, in which direction, or exploratory) and its mean difference keeps its sign; otherwise ``NOT
reproduced``. A row that enters no reading reproduces only when identical. How many of the per-example scores (and
answers) are the same is always printed, with the readings and how far their means moved.

A run trained in another precision than the row's is printed but not read either way (``NOT comparable``, exit
status 1): a CPU without fast bf16 trains a bf16 recipe in float32 instead, which is another experiment, not another
summation order.

The held-out answer loss (where the row has one) is judged the same way, by the readings on it.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import signal
import sys
from pathlib import Path
from typing import Optional

import driver
from report import (
    REPRODUCED,
    _decimals,
    _per,
    also_against,
    generations_path,
    judge,
    load,
    references,
    reproduction_path,
    reproduction_row_path,
)

from mutor.run.recipe import dotted_keys

HERE = Path(__file__).resolve().parent


def _answers(path: Path) -> Optional[list[str]]:
    """The generations of a kept ``<split>.jsonl.gz`` (None when it is not there)."""
    if not path.is_file():
        return None
    with gzip.open(path, "rt") as f:
        return [json.loads(x).get("generation") for x in f if x.strip()]


def compare(committed: dict, fresh: dict, splits: Optional[list[str]] = None,
            committed_answers: Optional[dict] = None, fresh_answers: Optional[dict] = None,
            rows: Optional[list[dict]] = None, references: Optional[dict] = None,
            also: Optional[dict] = None) -> list[dict]:
    """The fresh row beside the committed one, split by split and measure by measure, judged by the reproduction
    rule (``report.REPRODUCED``, :func:`report.judge`).

    Args:
        committed: The committed results row.
        fresh: The row trained and scored again.
        splits: The splits to compare (default: every split of the committed row).
        committed_answers: Split -> the committed generations, where kept.
        fresh_answers: Split -> the fresh generations.
        rows: The committed results rows, whose readings the row enters (default: the committed row alone, which
            enters none).
        references: The plan's diagnostic references (``report.references``).
        also: The plan's ``also_against`` (``report.also_against``).

    Returns:
        One dict per split and measure: ``split``, ``measure``, ``committed``, ``fresh``, ``difference``, ``n``,
        ``same_items`` (per-example values equal, None where either side has none), ``same_answers``
        (generations equal, None when either side has none kept), ``readings`` (how many readings the row enters),
        ``moved`` (the largest move of their mean differences), ``changed`` (the readings changed, in words) and
        ``status`` (``identical``, ``readings unchanged`` or ``NOT reproduced``).

    Raises:
        SystemExit: When a split asked for is not in both rows.
    """
    rows = [committed] if rows is None else rows
    out = []
    for split in splits or list(committed["splits"]):
        if split not in committed["splits"] or split not in fresh["splits"]:
            raise SystemExit(f"split {split!r}: not in both rows (committed: {sorted(committed['splits'])}, "
                             f"fresh: {sorted(fresh['splits'])})")
        c, f = _per(committed, split, "per_example"), _per(fresh, split, "per_example")
        if c is None or f is None or len(c) != len(f):
            raise SystemExit(f"split {split!r}: the rows do not have per-example scores of the same examples")
        ca, fa = (committed_answers or {}).get(split), (fresh_answers or {}).get(split)
        comparable = ca is not None and fa is not None and len(ca) == len(fa)
        measure = "exact match (points)" if committed.get("primary", "accuracy") == "accuracy" else \
            f"{committed['primary'].replace('_', ' ')} (points)"
        values = [(measure, sum(c) / len(c), sum(f) / len(f),
                   sum(a == b for a, b in zip(ca, fa)) if comparable else None)]
        sc, sf = committed["splits"][split], fresh["splits"][split]
        if sc.get("answer_loss") is not None and sf.get("answer_loss") is not None:
            values.append(("answer loss (nats)", sc["answer_loss"], sf["answer_loss"], None))
        for name, vc, vf, answers in values:
            j = judge(rows, committed, fresh, split, name, references, also)
            out.append({"split": split, "measure": name, "committed": vc, "fresh": vf, "difference": vf - vc,
                        "n": j["n"] or sc.get("n"), "same_items": j["same_items"], "same_answers": answers,
                        "readings": len(j["readings"]), "moved": j["moved"], "changed": j["changed"],
                        "status": j["status"]})
    return out


def reproduced(lines: list[dict]) -> bool:
    """Whether every compared split and measure holds by the reproduction rule (identical, or readings unchanged)."""
    return bool(lines) and all(x["status"] in ("identical", "readings unchanged") for x in lines)


def table(lines: list[dict], committed: Optional[dict] = None) -> str:
    """The comparison as a Markdown table, in the digits the committed value's per-example interval supports."""
    out = ["| split | measure | committed | fresh | difference | same per-example scores | same answers | "
           "readings the row enters | reading |", "|---|---|---|---|---|---|---|---|---|"]
    for x in lines:
        d = _decimals(committed, x)
        same = "-" if x["same_items"] is None else f"{x['same_items']}/{x['n']}"
        answers = "-" if x["same_answers"] is None else f"{x['same_answers']}/{x['n']}"
        readings = "none" if not x["readings"] else f"{x['readings']}; changed: " + "; ".join(x["changed"]) \
            if x["changed"] else f"{x['readings']}, unchanged (means moved by {x['moved']:.{d}f} at most)"
        out.append(f"| {x['split']} | {x['measure']} | {x['committed']:.{d}f} | {x['fresh']:.{d}f} | "
                   f"{x['difference']:+.{d}f} | {same} | {answers} | {readings} | {x['status']} |")
    return "\n".join(out)


def recipe_note(committed: dict, fresh: dict) -> str:
    """Whether the fresh run's resolved recipe is the one the committed row records."""
    old, new = committed.get("resolved_recipe"), fresh.get("resolved_recipe")
    if old is None:
        return "resolved recipe: the committed row records none (the plan's entry is its recipe)"
    if old == new:
        return "resolved recipe: the same as the committed row's"
    a, b = dotted_keys(old), dotted_keys(new or {})
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "resolved recipe: DIFFERS from the committed row's in " + ", ".join(keys)


def _precision(row: dict) -> str:
    """A row's training precision in words (``precision`` as the driver records it)."""
    p = row.get("precision") or {}
    if not p:
        return "not recorded"
    return f"{p.get('model_dtype')} weights" + (", bf16 autocast" if p.get("bf16_autocast") else "") + \
        (" (fell back: the CPU has no fast bf16)" if p.get("fallback") else "")


def same_precision(committed: dict, fresh: dict) -> bool:
    """Whether the fresh run trained in the committed row's precision (weights' dtype and bf16 autocast; true where
    the committed row records none). A CPU without fast bf16 trains a bf16 recipe in float32 instead (with a
    notice): that is another experiment, not another summation order, so its scores say nothing about whether the
    row reproduces."""
    a, b = committed.get("precision") or {}, fresh.get("precision") or {}
    return not a or all(a.get(k) == b.get(k) for k in ("model_dtype", "bf16_autocast"))


def precision_note(committed: dict, fresh: dict) -> str:
    """Whether the fresh run trained in the committed row's precision, in words (:func:`same_precision`)."""
    if not same_precision(committed, fresh):
        return f"precision: DIFFERS: committed {_precision(committed)}, fresh {_precision(fresh)}"
    return "precision: the same as the committed row's" if committed.get("precision") else \
        "precision: the committed row records none"


def machine_note(committed: dict, fresh: dict) -> str:
    """Whether the fresh run trained on the committed row's kind of machine (``machine`` as the driver records it:
    CPU model, its bf16 instruction sets, Python's and the packages' versions), naming what differs. Another
    machine may sum in another order, so a row trained there may flip some answers: it reproduces the row when the
    readings it enters are unchanged, not only when identical."""
    old, new = committed.get("machine"), fresh.get("machine") or {}
    if not old:
        return "machine: the committed row records none"
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if not keys:
        return "machine: the same kind as the committed row's"
    return "machine: DIFFERS from the committed row's in " + ", ".join(
        f"{k} ({old.get(k)} -> {new.get(k)})" for k in keys)


def record(results: Path, committed: dict, fresh: dict, lines: list[dict], generations: dict[str, Path]) -> Path:
    """Keep a reproduction beside the committed rows: its verdict as a row of ``reproductions.jsonl`` (replacing
    an earlier one of the same run) and, where it trained in the row's precision, the fresh row (``row.json``: its
    per-example scores and answer losses, which ``report.py`` judges it by again against the rows as they are when
    it renders) and its scored generations under ``reproductions/<group>/<run>/``.

    Args:
        results: The committed results file (the others are its siblings).
        committed: The committed row.
        fresh: The row trained and scored again.
        lines: :func:`compare`'s lines.
        generations: Split -> the fresh generations file (gzipped JSON lines).

    Returns:
        The reproductions file.
    """
    key, same = (committed["group"], committed["run"]), same_precision(committed, fresh)
    row = {"group": key[0], "run": key[1], "committed_code": committed.get("code"),
           "committed_finished_at": committed.get("finished_at"), "code": fresh.get("code"),
           "finished_at": fresh.get("finished_at"), "committed_threads": committed.get("threads"),
           "threads": fresh.get("threads"),
           "rule": "identical, or every reading the row enters unchanged (report.REPRODUCED)",
           "reproduced": reproduced(lines) and same,
           "identical": all(x["status"] == "identical" for x in lines),
           "recipe": recipe_note(committed, fresh), "precision": precision_note(committed, fresh),
           "machine": machine_note(committed, fresh), "same_precision": same, "lines": lines}
    path = results.with_name("reproductions.jsonl")
    with open(path, "a") as held:            # reproductions side by side record one after the other, none lost
        fcntl.flock(held, fcntl.LOCK_EX)
        kept = [r for r in load(path) if (r["group"], r["run"]) != key]
        path.write_text("".join(json.dumps(r) + "\n" for r in [*kept, row]))
    if same:                                          # the scores of another experiment are not the row's
        kept = reproduction_row_path(results, *key)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(fresh) + "\n")
    for split, src in generations.items():            # nor are its answers
        if same and src.is_file():
            dst = reproduction_path(results, *key, split)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", metavar="GROUP/RUN", help="the row to reproduce, e.g. rg-word-reversal/mutor_s0")
    ap.add_argument("--scratch", type=Path, default=driver.REPO / "runs" / "reproduce",
                    help="where the run, the fresh row and its generations go (default: runs/reproduce)")
    ap.add_argument("--split", action="append", default=None,
                    help="compare only this split (repeatable; default: every split of the row)")
    ap.add_argument("--plan", type=Path, default=HERE / "plan.yaml")
    ap.add_argument("--results", type=Path, default=None, help="the committed rows (default: the plan's results)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for training (default: the committed row's; another count sums in another order)")
    ap.add_argument("--record", action="store_true",
                    help="keep the verdict beside the committed rows (reproductions.jsonl, replacing an earlier one "
                         "of this run), and the fresh row (row.json) and generations under "
                         "reproductions/<group>/<run>/; report.py judges and shows them. Nothing is committed to git")
    args = ap.parse_args(argv)

    plan, runs = driver.load_plan(args.plan)
    wanted = tuple(args.run.split("/", 1)) if "/" in args.run else None
    run = next((r for r in runs if r.key == wanted), None)
    if run is None:
        raise SystemExit(f"{args.run}: no such run in {args.plan} (GROUP/RUN, e.g. "
                         f"{runs[0].group['name']}/{runs[0].name}; `driver.py --list` lists them)")
    results = args.results or (driver.REPO / plan["results"])
    committed = next((r for r in load(results) if (r["group"], r["run"]) == run.key), None)
    if committed is None:
        raise SystemExit(f"{args.run}: no committed row in {results}; the driver trains it (driver.py --only "
                         f"'{args.run}')")
    scratch = args.scratch.resolve()
    threads = args.threads or committed.get("threads") or 1
    opts = argparse.Namespace(runs_dir=str(scratch / "runs"), results=str(scratch / "results.jsonl"),
                              threads=threads, commit=False, slots=1, retrain=False)
    drv = driver.Driver(plan, opts)
    signal.signal(signal.SIGTERM, drv.stop)          # a stopped reproduction stops its children
    signal.signal(signal.SIGINT, drv.stop)
    d = drv.runs_dir / run.group["name"] / run.name
    d.parent.mkdir(parents=True, exist_ok=True)
    drv.log(run, f"reproducing into {d} ({threads} thread{'s' if threads > 1 else ''}, the committed row's: "
                 f"{committed.get('threads', '?')})")
    try:
        ev, losses = drv.train_and_score(run, d)
    except RuntimeError as err:
        raise SystemExit(f"{args.run}: {err}") from None
    if drv.stopping:
        return 1
    fresh = drv.row(run, d, ev, losses)
    kept = [r for r in load(drv.results) if (r["group"], r["run"]) != run.key]       # one row per run here
    drv.results.write_text("".join(json.dumps(r) + "\n" for r in [*kept, fresh]))
    drv.keep_generations(fresh, ev)

    splits = args.split or list(committed["splits"])
    old = {s: _answers(generations_path(results, *run.key, s)) for s in splits}
    new = {s: _answers(generations_path(drv.results, *run.key, s)) for s in splits}
    lines = compare(committed, fresh, splits, old, new, load(results), references(args.plan), also_against(args.plan))
    print(f"\n{args.run}: committed row (code {committed.get('code', '?')}, {committed.get('finished_at', '?')}) "
          f"beside the fresh one (code {fresh['code']}, row in {drv.results})\n")
    print(table(lines, committed))
    print(f"\ntraining next-token loss at the end: committed {committed.get('train_ntp_loss_last')}, "
          f"fresh {fresh.get('train_ntp_loss_last')}")
    print(recipe_note(committed, fresh))
    print(precision_note(committed, fresh))
    print(machine_note(committed, fresh))
    if args.record:
        kept_at = record(results, committed, fresh, lines,
                         {s: generations_path(drv.results, *run.key, s) for s in splits})
        print(f"recorded in {kept_at}")
    if not same_precision(committed, fresh):
        print("NOT comparable: trained in another precision than the row's (a CPU with fast bf16 reproduces it)")
        return 1
    ok = reproduced(lines)
    print(f"\nThe rule: {REPRODUCED}.")
    if ok:
        print("reproduced" + (" (identical)" if all(x["status"] == "identical" for x in lines) else
                              " (not identical; every reading it enters unchanged)"))
    else:
        print("NOT reproduced: " + ("a reading it enters changed" if any(x["changed"] for x in lines) else
                                    "the scores differ and the row enters no reading"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
