"""Register drafting replayed offline from the command line: record traces from a checkpoint, replay policies.

The replay itself is :mod:`mutor.generation.replay` (the real decoding loop on a recorded trace, each forward
charged from a table of measured seconds by its rows); this records traces and row costs from a checkpoint's
task prompts and prints a comparison of fixed K = 2..d_max and ``auto`` against plain decoding:

    python -m benchmarks.draft_replay RUN/checkpoint-125 --task reasoning_gym --split validation --limit 50 \
        --record traces.json                # once: a forward per prompt, and the row costs (--dtype as decoded)
    python -m benchmarks.draft_replay RUN/checkpoint-125 --task reasoning_gym --traces traces.json
                                            # the row costs again (on a quiet machine), into traces.json
    python -m benchmarks.draft_replay --traces traces.json [--costs 60,64,67,...]   # replay: K = 1..d_max, auto
    python -m benchmarks.draft_replay --traces traces.json --repeats 12 --shuffle   # over 12 orders of the prompts
    python -m benchmarks.draft_replay --traces traces.json --repeats 10 \
        --load benchmarks/draft_traces/forward_times/wr3ep0_fp32_{quiet,beside_training}.json   # under a recorded load
    python -m benchmarks.draft_replay --traces traces.json --sample 20 --draws 100 --load ...
                                            # what one 20-prompt measurement (drafting.py's) can show

The row costs depend on the machine, the dtype, the threads and the cached length, not on the registers:
measure them where the policy will run, with nothing else loading the CPU.

``benchmarks/draft_traces/`` keeps the traces recorded from the evidence runs (validation prompts, token ids
and row costs only), so that a policy can be replayed on them after their checkpoints are gone;
tests/test_draft_replay.py holds ``auto`` to at least plain decoding and near the best fixed K on each.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

from mutor.generation.policy import DraftPolicy, DraftSettings, FixedDraft
from mutor.generation.replay import compare, load_ratios, record, row_costs, spread, trace_costs


def _load(args):
    """(model, tokenizer, prompts, max_new_tokens, prefix mode) of ``args.checkpoint`` on its task's split."""
    from mutor.eval.harness import load_drafter, run_info, task_prompts

    mode = run_info(str(args.checkpoint)).get("prefix_attention", "causal")
    model, tok = load_drafter(str(args.checkpoint), dtype=args.dtype, device="cpu")
    prompts, bench = task_prompts(args.task, tok, args.split, args.data, args.limit, model_path=str(args.checkpoint))
    return model, tok, prompts, int(args.max_new_tokens or bench.template.max_new_tokens), mode


def _costs(model, prompts, mode) -> dict:
    d_max = model.mutor_config.d_max
    mid = sorted(prompts, key=len)[len(prompts) // 2]                # a prompt of median length
    return {"threads": torch.get_num_threads(),
            "row_seconds": row_costs(model, mid, d_max * d_max, prefix_attention=mode)}


def settings(pairs: list[str]) -> dict:
    """``NAME=VALUE`` pairs as ``DraftSettings`` keyword arguments (numbers as ints or floats, comma-separated
    numbers as a tuple, else strings)."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=VALUE, got {pair!r}")
        if "," in value:
            try:
                out[name] = tuple(float(x) for x in value.split(","))
                continue
            except ValueError:
                pass
        for kind in (int, float, str):
            try:
                out[name] = kind(value)
                break
            except ValueError:
                pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path, nargs="?", help="record traces (or, with --traces, costs) from this "
                                                              "MuToR checkpoint")
    ap.add_argument("--task", default=None)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--data", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--record", type=Path, default=None, help="write the traces (and the row costs) here")
    ap.add_argument("--traces", type=Path, default=None, help="replay these traces; with a checkpoint: measure its "
                                                              "row costs again into this file")
    ap.add_argument("--costs", default=None, help="ms of a forward of 1, 2, ... rows, comma-separated "
                                                  "(default: the costs measured when recording)")
    ap.add_argument("--noise", type=float, default=0.0, help="log-normal spread of a forward's cost (e.g. 0.1)")
    ap.add_argument("--spikes", type=float, default=0.0, help="share of forwards taking 2-3x (e.g. 0.03)")
    ap.add_argument("--load", type=Path, nargs=2, metavar=("QUIET", "LOADED"), default=None,
                    help="draw each forward's cost factor from a recorded load: per-forward times of the same "
                         "decoding quiet and loaded (draft_traces/forward_times/)")
    ap.add_argument("--drift", type=float, default=0.0, help="a load that moves: each forward's cost times exp(x), "
                    "x <- 0.98 x + N(0, DRIFT) per forward, so that neighbouring forwards share their load (e.g. 0.1)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what the policy is told: the "
                    "loaded cost (a wall clock), or the cost without the load (a CPU-time clock, idealised)")
    ap.add_argument("--cold", type=float, default=1.0, help="the first forward of each row count costs this many "
                    "times more (a shape's warm-up: kernels loaded, primitives made), e.g. 3")
    ap.add_argument("--repeats", type=int, default=1, help="noise draws, summed")
    ap.add_argument("--shuffle", action="store_true", help="each draw after the first decodes the prompts in "
                    "another order (a policy learns as it decodes: one order is one path of its choices)")
    ap.add_argument("--sample", type=int, default=None, help="instead: the spread of a measurement on this many "
                                                             "prompts (e.g. 20, as drafting.py), over --draws draws")
    ap.add_argument("--draws", type=int, default=100, help="with --sample: random prompt samples and cost draws")
    ap.add_argument("--auto", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting of auto's DraftSettings (memory, revisit, optimism, smoothing, ...), e.g. "
                         "--auto optimism=0.5: replayed as 'auto*' beside the default 'auto'")
    args = ap.parse_args(argv)
    if args.checkpoint is not None and args.task is None:
        ap.error("--task is needed to record from a checkpoint: an evaluation task of mutor eval (e.g. reasoning_gym)")
    if args.checkpoint is None and args.traces is None:
        ap.error("give a checkpoint to record traces from, or --traces to replay")
    if args.checkpoint is not None:
        with torch.no_grad():
            model, tok, prompts, n_new, mode = _load(args)
            if args.traces is not None:                  # costs only, e.g. again on a quiet machine
                traces = {**json.loads(args.traces.read_text()), **_costs(model, prompts, mode)}
                args.traces.write_text(json.dumps(traces))
            else:
                traces = {"checkpoint": str(args.checkpoint), "task": args.task, "split": args.split,
                          "dtype": args.dtype, "max_new_tokens": n_new, "eos": [tok.eos_token_id],
                          "d_max": model.mutor_config.d_max,
                          "traces": [record(model, p, n_new, tok.eos_token_id, mode) for p in prompts],
                          **_costs(model, prompts, mode)}
                (args.record or Path("traces.json")).write_text(json.dumps(traces))
    else:
        traces = json.loads(args.traces.read_text())
    if args.costs:
        costs = {i + 1: float(c) / 1000 for i, c in enumerate(args.costs.split(","))}
    else:
        costs = trace_costs(traces)
    k_max = traces["d_max"]
    policies: dict[str, Callable[[], object]] = {f"K={k}": (lambda k=k: FixedDraft(k)) for k in range(2, k_max + 1)}
    policies["auto"] = lambda: DraftPolicy(k_max)
    if args.auto:
        try:
            chosen = DraftSettings(**settings(args.auto))
        except (ValueError, TypeError) as e:
            ap.error(f"--auto takes NAME=VALUE settings of DraftSettings ({e})")
        policies["auto*"] = lambda: DraftPolicy(k_max, chosen)
    load = load_ratios(*(json.loads(f.read_text()) for f in args.load)) if args.load else None
    if args.sample:
        out = spread(traces, costs, policies, args.sample, args.draws, noise=args.noise, spikes=args.spikes, load=load,
                     drift=args.drift, clock=args.clock, cold=args.cold)
    else:
        out = compare(traces, costs, policies, noise=args.noise, spikes=args.spikes, repeats=args.repeats, load=load,
                      drift=args.drift, clock=args.clock, cold=args.cold, shuffle=args.shuffle)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
