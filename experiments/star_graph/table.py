"""Print results.jsonl as a markdown table, one row per run and method (for RUNS.md).

    python experiments/star_graph/table.py [NAME_SUBSTRING ...]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(filters: list[str]) -> None:
    rows = [json.loads(line) for line in (HERE / "results.jsonl").read_text().splitlines() if line.strip()]
    if filters:
        rows = [r for r in rows if any(f in r["name"] for f in filters)]
    ref = {(r["name"], r["steps"]): r for r in rows if r["method"] == "next_token"}
    print("| run | overrides | method | steps | wall s | solve | first hop | a1 loss | best solve (step) | "
          "mutor - nt (2 s.e.) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        diff = ""
        nt = ref.get((r["name"], r["steps"]))
        if r["method"] != "next_token" and nt is not None:
            noise = 2 * math.sqrt(2 * 0.25 / r["num_eval"])
            d = r["solve"] - nt["solve"]
            diff = f"{d:+.3f} ({noise:.3f}){' **beyond**' if abs(d) > noise else ''}"
        ov = " ".join(o for o in r["overrides"] if not o.startswith(("training.eval_steps", "data.num_train")))
        print(f"| {r['name']} | `{ov}` | {r['method']} | {r['steps']} | {r['wall_s']:.0f} | {r['solve']:.3f} | "
              f"{r['first_hop']:.3f} | {r['a1_loss']:.3f} | {r['best_solve']:.3f} ({r['best_step']}) | {diff} |")


if __name__ == "__main__":
    main(sys.argv[1:])
