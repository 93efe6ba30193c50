"""Pool repeated drafting measurements of one checkpoint: each decoder's speed against greedy over all of them.

``experiments/evidence/drafting.py`` measures one pass over the prompts; on a quiet two-core VM two passes of the
same checkpoint can read 2-4 % apart, more than what separates `auto` from greedy where registers do not pay.
This pools several passes (their ``per_prompt_seconds``, same prompts in the same
order): per decoder, greedy's seconds over its seconds, summed over every pass, with a 95 % bootstrap interval
(``mutor.eval.timing``) that resamples the prompts, each with all its passes (a prompt's passes are not
independent draws)::

    python -m benchmarks.pool_drafting PASS1.json PASS2.json PASS3.json     # drafting.py --output, one checkpoint
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mutor.eval.timing import bootstrap_ratio


def pool(rows: list[dict], draws: int = 2000, seed: int = 0) -> dict:
    """``{decoder: {"speedup_vs_greedy", "ci95", "per_pass"}}`` over ``rows`` (drafting.py results of one
    checkpoint and prompt set)."""
    if not rows:
        raise ValueError("pool: no measurements")
    n = rows[0]["prompts"]
    for r in rows:
        if r["prompts"] != n or r["checkpoint"] != rows[0]["checkpoint"] or "per_prompt_seconds" not in r["greedy"]:
            raise ValueError(f"pool: {r['checkpoint']} ({r['prompts']} prompts) does not pool with "
                             f"{rows[0]['checkpoint']} ({n}), or was measured without per-prompt seconds")
    names = [k for k in rows[0]["drafting"] if all(k in r["drafting"] for r in rows)]
    # per prompt, summed over the passes: (n,) for greedy and each decoder
    total = lambda pick: [sum(pick(r)[i] for r in rows) for i in range(n)]
    greedy = total(lambda r: r["greedy"]["per_prompt_seconds"])
    out = {}
    for name in names:
        mine = total(lambda r: r["drafting"][name]["per_prompt_seconds"])
        out[name] = {"speedup_vs_greedy": round(sum(greedy) / sum(mine), 4),
                     "ci95": bootstrap_ratio(greedy, mine, draws, seed),
                     "per_pass": [r["drafting"][name]["speedup_vs_greedy"] for r in rows]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", type=Path, nargs="+", help="drafting.py results (--output) of one checkpoint")
    args = ap.parse_args(argv)
    rows = [json.loads(f.read_text()) for f in args.files]
    try:
        pooled = pool(rows)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(json.dumps({"checkpoint": rows[0]["checkpoint"], "passes": len(rows), "prompts": rows[0]["prompts"],
                      "pooled": pooled}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
