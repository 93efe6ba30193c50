"""One star-graph search run: the shipped default recipe plus overrides, results appended to results.jsonl.

    OMP_NUM_THREADS=1 nice -n 10 python experiments/star_graph/sweep.py NAME [key=value ...]

Runs ``mutor.run.train.run_recipe("base.yaml", overrides)`` (base.yaml: the default recipe when the search
began) (log lines, no progress bar) with checkpoints and TensorBoard under /work/exp/sg/NAME (or
$SG_OUT/NAME), then appends one JSON line per method to
``experiments/star_graph/results.jsonl``: the overrides, steps, wall time, the final and best
held-out solve rate / first hop, and the whole evaluation history (small). ``--resume``
continues a run from its checkpoints (a long run can be stopped and started again).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("SG_OUT", "/work/exp/sg"))


def main(argv: list[str]) -> int:
    resume = "--resume" in argv
    argv = [a for a in argv if a != "--resume"]
    name, overrides = argv[0], argv[1:]
    import torch

    torch.set_num_threads(1)
    from mutor.run.train import run_recipe

    base = ["threads=1", "training.report_to=[]", "training.save_steps=100000", "training.logging_steps=100",
            "training.disable_tqdm=true", f"training.output_dir={OUT / name}"]
    t0 = time.time()
    result = run_recipe(str(HERE / "base.yaml"), base + overrides, resume=resume, quiet=False)
    wall = time.time() - t0
    lines = []
    for run in result["runs"]:
        hist = [{k.removeprefix("eval_"): v for k, v in h.items() if k.startswith("eval_")}
                for h in run["eval_history"]]
        fin = hist[-1]
        best = max(hist, key=lambda h: h["solve_rate"])
        lines.append({"name": name, "method": run["method"], "overrides": overrides, "resumed": resume,
                      "steps": run["global_step"], "wall_s": round(run["wall_seconds"], 1),
                      "solve": fin["solve_rate"], "first_hop": fin["first_hop"], "a1_loss": round(fin["a1_loss"], 4),
                      "best_solve": best["solve_rate"], "best_step": best["step"], "num_eval": fin["num_eval"],
                      "curve": [(h["step"], h["solve_rate"], h["first_hop"], round(h["a1_loss"], 3)) for h in hist],
                      "train_tail": {k: v for k, v in run["train_history"][-1].items()
                                     if k in ("ntp_loss", "reg_loss") or k.startswith("reg_accuracy")}})
    with open(HERE / "results.jsonl", "a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    for line in lines:
        print(f"{name:28s} {line['method']:10s} steps {line['steps']:5d} solve {line['solve']:.3f} "
              f"hop {line['first_hop']:.3f} a1_loss {line['a1_loss']:.3f} best {line['best_solve']:.3f}"
              f"@{line['best_step']} wall {line['wall_s']:.0f}s", flush=True)
    print(f"total {wall:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
