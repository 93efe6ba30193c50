"""Two draft policies on the clock, live: this checkout's ``DraftPolicy`` against another commit's, same process.

A policy change is judged on recorded traces first (``draft_replay``), but a replay charges costs from a table
and cannot show how a policy reads a real machine's load. This decodes the same prompts with plain decoding
(``K=1`` on the drafting path), this checkout's ``auto`` and ``auto`` with the ``DraftPolicy`` of another source
tree (a git worktree of another commit; without one, this checkout's with other settings, ``--baseline-set``), all
through this checkout's ``mutor.generate``, the three taking turns on each prompt (in the orders of a Williams
design, ``mutor.eval.timing``) so that a change of machine load hits them alike; one policy instance each for all
prompts, as ``mutor eval``. Prints one JSON object: seconds, speed against ``K=1`` and rounds per K, with 95 %
intervals over the prompts (``mutor.eval.timing``), and the two policies' ratio with its interval::

    git worktree add --detach /tmp/old 5cac6a2
    python -m benchmarks.chooser_ab RUN/checkpoint-375 --task reasoning_gym --limit 60 --baseline-src /tmp/old/src
    python -m benchmarks.chooser_ab RUN/checkpoint-375 --task reasoning_gym --baseline-set clock=wall
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

from mutor.eval.timing import bootstrap_ratio, williams_orders


def baseline_policy(src: Path):
    """The module ``src/mutor/generation/policy.py`` of another tree (it imports nothing of mutor's): its
    ``DraftPolicy`` and ``DraftSettings``, every method and default its own."""
    path = src / "mutor" / "generation" / "policy.py"
    if not path.is_file():
        raise SystemExit(f"--baseline-src: no {path}")
    spec = importlib.util.spec_from_file_location("baseline_draft_policy", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                                   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    from benchmarks.draft_replay import settings
    from mutor.eval.harness import load_drafter, run_info, task_prompts
    from mutor.generation import DraftPolicy, DraftSettings, DraftStats, FixedDraft, generate
    from mutor.generation import policy as this_tree

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--task", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (drafting.py's evidence rows: 1)")
    ap.add_argument("--baseline-src", type=Path, default=None, help="the src/ folder of the other tree (default: "
                    "this checkout's policy)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a DraftSettings field of auto")
    ap.add_argument("--baseline-set", action="append", default=[], metavar="NAME=VALUE",
                    help="a DraftSettings field of the baseline")
    args = ap.parse_args(argv)
    if args.baseline_src is None and not args.baseline_set and not args.set:
        raise SystemExit("nothing to compare: give --baseline-src, --set or --baseline-set")
    torch.set_num_threads(args.threads)
    baseline = baseline_policy(args.baseline_src) if args.baseline_src else this_tree
    mine, theirs = settings(args.set), settings(args.baseline_set)
    mode = run_info(str(args.checkpoint)).get("prefix_attention", "causal")
    model, tok = load_drafter(str(args.checkpoint), dtype=args.dtype, device="cpu")
    prompts, bench = task_prompts(args.task, tok, args.split, None, args.limit, model_path=str(args.checkpoint))
    n_new, eos = bench.template.max_new_tokens, tok.eos_token_id
    d_max = model.mutor_config.d_max
    choosers = {"K=1": FixedDraft(1), "auto": DraftPolicy(d_max, DraftSettings(**mine)),
                "auto (baseline)": baseline.DraftPolicy(d_max, baseline.DraftSettings(**theirs))}
    per_prompt = {name: [] for name in choosers}                    # seconds per prompt, for paired intervals
    stats = {name: DraftStats() for name in choosers}
    names, orders = list(choosers), williams_orders(len(choosers))
    with torch.no_grad():
        for i, p in enumerate(prompts):
            for name in (names[j] for j in orders[i % len(orders)]):
                t0 = time.perf_counter()
                _, st = generate(model, torch.tensor([p]), n_new, choosers[name], eos_token_id=eos,
                                 prefix_attention=mode)
                per_prompt[name].append(time.perf_counter() - t0)
                stats[name].add(st)
    secs = {name: sum(t) for name, t in per_prompt.items()}
    out = {"checkpoint": str(args.checkpoint), "prompts": len(prompts), "dtype": args.dtype,
           "threads": torch.get_num_threads(), "baseline_src": str(args.baseline_src),
           "set": mine, "baseline_set": theirs,
           **{name: {"seconds": round(secs[name], 2), "speed_vs_K1": round(secs["K=1"] / secs[name], 3),
                     **{k: v for k, v in stats[name].to_dict().items() if k in ("rounds", "acceptance")},
                     "speed_vs_K1_ci95": bootstrap_ratio(per_prompt["K=1"], per_prompt[name]),
                     "per_prompt_seconds": [round(t, 4) for t in per_prompt[name]],
                     **({} if isinstance(choosers[name], FixedDraft) else {"state": choosers[name].state()})}
              for name in names},
           "auto_vs_baseline": {"speed": round(secs["auto (baseline)"] / secs["auto"], 3),
                                "ci95": bootstrap_ratio(per_prompt["auto (baseline)"], per_prompt["auto"])}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
