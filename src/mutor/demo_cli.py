"""``mutor demo``: argument parsing for :mod:`mutor.demo` (the logic lives there)."""

from __future__ import annotations

import argparse
from dataclasses import replace


def add_parser(sub) -> None:
    demo = sub.add_parser(
        "demo", help="train a tiny Llama with next-token prediction and with MuToR on path-star graphs (CPU)",
        description="Train a tiny random-init Llama twice (same init, same data order): next-token prediction, "
                    "then MuToR. Reports held-out exact match and first-hop accuracy, and writes results.json, "
                    "results.md and accuracy.png into --output-dir. Defaults take about 5-10 minutes on 2 CPU cores.")
    demo.add_argument("--steps", type=int, default=None, help="training steps per method (default 1000; --tiny: 20)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the data, the initialisation and the data order")
    demo.add_argument("--output-dir", default="runs/demo", help="where results go (default: runs/demo)")
    demo.add_argument("--tiny", action="store_true", help="a smoke run of well under a minute (nothing is learned)")
    demo.add_argument("--eval-every", type=int, default=None, help="held-out evaluation interval in steps")
    demo.add_argument("--num-test", type=int, default=None, help="held-out graphs (default 500)")
    demo.add_argument("--degree", type=int, default=None, help="arms of the star graph (default 2)")
    demo.add_argument("--path-len", type=int, default=None, help="nodes on the answer path (default 5)")
    demo.add_argument("--num-nodes", type=int, default=None, help="node labels to draw from (default 50)")
    demo.add_argument("--loss-weight", type=float, default=None, help="MuToR's a (default 0.3)")
    demo.add_argument("--d-max", type=int, default=None, help="MuToR's largest offset (default 4)")
    demo.add_argument("--min-offset", type=int, default=None, help="MuToR's smallest offset (default 2)")
    demo.add_argument("--threads", type=int, default=1,
                      help="torch CPU threads (default 1: the tiny model gains ~1.5x from 2 threads on an idle "
                           "machine, but multi-threaded torch slows ~10x when other jobs share the cores)")
    demo.add_argument("--quiet", action="store_true", help="print nothing")


def run(args: argparse.Namespace) -> int:
    from . import demo
    from .config import MuToRConfig

    s = demo.tiny_settings() if args.tiny else demo.DemoSettings()
    over = {k: v for k, v in (("steps", args.steps), ("seed", args.seed), ("eval_every", args.eval_every),
                              ("num_test", args.num_test)) if v is not None}
    task = {k: v for k, v in (("degree", args.degree), ("path_len", args.path_len),
                              ("num_nodes", args.num_nodes)) if v is not None}
    mutor = {k: v for k, v in (("loss_weight", args.loss_weight), ("d_max", args.d_max),
                               ("min_offset", args.min_offset)) if v is not None}
    try:
        if task:
            over["task"] = replace(s.task, **task)
        if mutor:
            over["mutor"] = MuToRConfig.from_dict({**s.mutor.to_dict(), **mutor})
    except ValueError as err:
        raise SystemExit(f"mutor demo: {err}") from None
    s = replace(s, **over)
    if s.steps < 1 or s.eval_every < 1 or s.num_test < 1 or args.threads < 1:
        raise SystemExit("mutor demo: --steps, --eval-every, --num-test and --threads must be >= 1")
    demo.run_demo(s, args.output_dir, quiet=args.quiet, threads=args.threads)
    return 0
