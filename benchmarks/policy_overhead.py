"""What deciding costs: the seconds ``auto``'s policy spends a round, away from any model.

A ``DraftPolicy`` is told a state like a trained run's (a cost for each of several row counts, drafts mostly
kept), then each round it learns a forward's cost and a draft's outcome and plans the next round, as
``mutor.generation.loop.decode`` calls it. The rounds are timed together; the default state is a word-reversal
run's (SmolLM2-135M, float32, k_max 4, ten row counts measured)::

    python -m benchmarks.policy_overhead                # ms a round
    python -m benchmarks.policy_overhead --rounds 2000 --k-max 3
"""

from __future__ import annotations

import argparse
import json
import time

from mutor.generation import DraftPolicy

WORD_REVERSAL_MS = {1: 146.8, 2: 218.2, 3: 266.5, 4: 233.7, 5: 257.9, 6: 244.1, 7: 288.0, 9: 295.5, 12: 300.9,
                    16: 360.9}


def ms_per_round(k_max: int = 4, rounds: int = 500, costs_ms: dict[int, float] = WORD_REVERSAL_MS) -> float:
    """Milliseconds a round of ``record`` + ``observe`` + ``plan`` takes, over ``rounds`` rounds."""
    policy = DraftPolicy(k_max)
    for rows, ms in costs_ms.items():
        for _ in range(5):
            policy.record(rows, ms / 1000)
    for _ in range(100):
        policy.observe(k_max - 1, k_max - 1)
        policy.observe(k_max - 1, k_max - 2, first=True)
    fed = k_max * k_max if k_max * k_max in costs_ms else max(costs_ms)
    t0 = time.perf_counter()
    for _ in range(rounds):
        policy.record(fed, costs_ms[fed] / 1000)
        policy.observe(k_max - 1, k_max - 1)
        policy.plan(k_max - 1)
    return (time.perf_counter() - t0) / rounds * 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k-max", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=500)
    args = ap.parse_args(argv)
    print(json.dumps({"k_max": args.k_max, "rounds": args.rounds,
                      "ms_per_round": round(ms_per_round(args.k_max, args.rounds), 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
