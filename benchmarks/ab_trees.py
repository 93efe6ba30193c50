"""MuToR-over-plain step time of two source trees of mutor, interleaved, for a busy machine.

    git archive 720178a | tar -x -C /tmp/before        # any older tree of this repository
    python -m benchmarks.ab_trees /tmp/before/src src --answer-length 512 --threads 2 --loss-chunk 1024 --rounds 3

Every round runs ``plain`` and ``mutor`` (the cases of ``benchmarks.step_time``, same model, batch
and spec) for each tree, one fresh process per case, the tree order alternating between rounds.
The figure per tree and round is the ratio of the two *adjacent* processes' median step times
(wall and CPU), divided by the token ratio, so that load that changes over minutes hits both
halves of a ratio alike; reported are the per-round figures and their medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from benchmarks.step_time import PRESETS, run_case_subprocess


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab_trees", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs=2, type=Path, help="two directories that hold the `mutor` package (e.g. src)")
    p.add_argument("--answer-length", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--loss-chunk", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args(argv)
    for t in args.trees:
        if not (t / "mutor" / "__init__.py").is_file():
            p.error(f"{t} holds no mutor package (expected {t / 'mutor' / '__init__.py'})")
    model = dict(PRESETS["default"], attn="sdpa", dtype="float32")
    base = dict(answer_length=args.answer_length, prompt_length=64, batch_size=8, repeats=args.repeats,
                warmup=args.warmup, threads=args.threads, seed=0, d_max=4, loss_weight=0.3, model=model,
                loss_chunk=args.loss_chunk)
    names = [str(t) for t in args.trees]
    figures = {n: [] for n in names}
    saved = os.environ.get("PYTHONPATH")
    try:
        for rnd in range(args.rounds):
            for tree in (args.trees if rnd % 2 == 0 else args.trees[::-1]):
                os.environ["PYTHONPATH"] = str(tree.resolve())
                res = {c: run_case_subprocess(dict(base, case=c)) for c in (["plain", "mutor"] if rnd % 2 == 0
                                                                            else ["mutor", "plain"])}
                pl, mu = res["plain"], res["mutor"]
                token_ratio = (pl["regular_tokens"] + mu["registers"]) / pl["regular_tokens"]
                fig = dict(wall=mu["median_ms"] / pl["median_ms"] / token_ratio,
                           cpu=mu["cpu_median_ms"] / pl["cpu_median_ms"] / token_ratio,
                           plain_ms=pl["median_ms"], mutor_ms=mu["median_ms"], plain_cpu=pl["cpu_median_ms"],
                           mutor_cpu=mu["cpu_median_ms"], plain_faults=pl["minor_faults_per_step"],
                           mutor_faults=mu["minor_faults_per_step"], load=mu["loadavg_after"][0])
                figures[str(tree)].append(fig)
                print(f"# round {rnd} {tree}: plain {fig['plain_ms']:.0f} ms (cpu {fig['plain_cpu']:.0f}), "
                      f"mutor {fig['mutor_ms']:.0f} ms (cpu {fig['mutor_cpu']:.0f}); per token ratio: "
                      f"wall {fig['wall']:.3f}, cpu {fig['cpu']:.3f}; faults/step {fig['plain_faults']:.0f} / "
                      f"{fig['mutor_faults']:.0f}; load {fig['load']:.2f}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    print("\n| tree | MuToR time / plain / token ratio (wall), median | same, CPU time | per round (wall) "
          "| plain faults/step | MuToR faults/step |\n|---|---:|---:|---|---:|---:|")
    for n, fs in figures.items():
        print(f"| {n} | {statistics.median(f['wall'] for f in fs):.3f} | {statistics.median(f['cpu'] for f in fs):.3f} "
              f"| {', '.join('%.3f' % f['wall'] for f in fs)} | {statistics.median(f['plain_faults'] for f in fs):.0f} "
              f"| {statistics.median(f['mutor_faults'] for f in fs):.0f} |")
    return figures


if __name__ == "__main__":
    main()
