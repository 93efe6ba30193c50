"""``auto`` replayed on every recorded trace set, three ways: quiet, under the recorded load, under a moving load.

The three replays ``tests/test_draft_replay.py`` holds ``auto`` to (at least 0.99x plain decoding each), as one
table, so that a change to the policy is seen on all ten sets at once before it is tried live:

    python -m benchmarks.replay_all                       # this checkout's policy, as the tests take it
    python -m benchmarks.replay_all --auto explore=0.01   # a setting changed (a DraftSettings field)
    PYTHONPATH=/tmp/variant/src python -m benchmarks.replay_all --json variant.json   # another tree's policy

Quiet: the traces' own row costs, 12 orders of the prompts. Recorded: the policy is told each forward's cost times
a factor drawn from the per-forward times recorded beside a training run
(``forward_times/wr3ep0_fp32_{quiet,beside_training}.json``) and charged its row count's mean factor (so that the
table reads the policy's choices, not its draws' luck), 12 draws. Moving: times exp(x), x a slow random walk
(drift 0.1), 240 draws (with 60, a cell still moves by +-0.3 % with its draws). Every draw after the first decodes
the prompts in another order: the policy learns as it decodes, and one order is one path of its choices (the
same prompts reordered moved a quiet cell by 2-3 %). A figure below 0.99 (marked *) fails the tests, unless they
list it as an expected failure (``XFAIL``).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from benchmarks.draft_replay import settings
from mutor.generation.replay import LOADS, compare, load_ratios, trace_costs

TRACES = Path(__file__).parent / "draft_traces"


@functools.lru_cache(maxsize=1)
def recorded_load() -> dict[int, list[float]]:
    """The recorded load: per-forward cost factors beside a training run (``mutor.generation.replay.load_ratios``)."""
    return load_ratios(*(json.loads((TRACES / "forward_times" / f"wr3ep0_fp32_{x}.json").read_text())
                         for x in ("quiet", "beside_training")))


def replay_auto(traces: dict, kind: str, options: dict | None = None) -> dict:
    """``compare``'s result for ``auto`` (``DraftPolicy`` with the settings ``options``) on ``traces`` at their own
    row costs, under the load ``kind`` (a key of ``LOADS``), as the suite replays it."""
    from mutor.generation import DraftPolicy, DraftSettings

    costs = trace_costs(traces)
    extra = dict(LOADS[kind], **({"load": recorded_load()} if kind == "recorded" else {}))
    policies = {"auto": lambda: DraftPolicy(traces["d_max"], DraftSettings(**(options or {})))}
    return compare(traces, costs, policies, **extra)


def replay_all(options: dict, loads=tuple(LOADS)) -> dict[str, dict[str, float]]:
    """``{set: {load: auto's speed-up over plain}}`` over the trace sets of ``benchmarks/draft_traces``."""
    out = {}
    for path in sorted(TRACES.glob("*_val.json")):
        traces = json.loads(path.read_text())
        out[path.stem] = {kind: replay_auto(traces, kind, options)["auto"]["speedup"] for kind in loads}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auto", action="append", default=[], metavar="NAME=VALUE",
                    help="a DraftSettings field for auto (repeatable)")
    ap.add_argument("--loads", default=",".join(LOADS), help="which replays, comma-separated: quiet,recorded,moving")
    ap.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    loads = tuple(x for x in args.loads.split(",") if x)
    unknown = set(loads) - set(LOADS)
    if unknown:
        raise SystemExit(f"--loads: unknown {', '.join(sorted(unknown))} (expected some of {', '.join(LOADS)})")
    table = replay_all(settings(args.auto), loads)
    print(f"{'set':<18}" + "".join(f"{k:>10}" for k in loads))
    for name, row in table.items():
        print(f"{name:<18}" + "".join(f"{row[k]:>9.3f}{'*' if row[k] < 0.99 else ' '}" for k in loads))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
