"""The benchmark suite: every training objective in one run, one fresh process per case.

    python -m benchmarks.suite                       # CPU: small Llama, batch 8, prompt 64 + answer 512
    python -m benchmarks.suite --throughput          # + samples/s at batch 10, sequence 512, vs official-style
    python -m benchmarks.suite --throughput --loss-chunk 1024 --rounds 3   # the figures in RESULTS.md
    python -m benchmarks.suite --gpu                 # ~1B Llama-shaped, bf16, flex_attention, seq 512/2048/8192
    python -m benchmarks.suite --tiny                # seconds; what the CI smoke test runs

Cases (same seeded random-init Llama, same batch; figures from ``benchmarks.step_time``'s
measuring code: median of timed forward+backward steps after warm-up, peak memory growth):

* ``plain``: next-token training of the model as it is (with ``--loss-chunk``, through the same
  chunked loss as the mutor and multi_token cases, so their ratios measure the method alone);
* ``mutor``: MuToR with a register on every eligible answer token (split attention under sdpa,
  a BlockMask under flex_attention; ``--loss-chunk N`` for the chunked loss, on by default with ``--gpu``);
* ``mutor_fixed``: MuToR with a fixed number of registers per sequence (``--fixed-registers``);
* ``multi_token``: the Multi-Token heads baseline (``d_max=2``, one extra decoder layer);
* ``official``: the official-style reference (:mod:`mutor.testing.official_style`): batch 1,
  interleaved registers, a dense additive float mask per example (so sdpa, even in a flex
  run), full-vocabulary logits.

Ratios: time and memory over ``plain``, and the time ratio over the token ratio
``(regular + registers) / regular`` (for ``multi_token``, the extra tokens are the heads' targets).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from benchmarks.step_time import PRESETS, environment, merge_rounds, run_case, run_case_subprocess

CASES = ("plain", "mutor", "mutor_fixed", "multi_token", "official")
GPU_MODEL = dict(hidden=2048, layers=16, heads=32, intermediate=8192, vocab=32000)   # ~1.1B, Llama-shaped


def _row(case: str, r: dict, plain: dict, batch: int) -> dict:
    tok_ratio = (r["regular_tokens"] + r["registers"]) / r["regular_tokens"]
    t_ratio = r["median_ms"] / plain["median_ms"]
    return {"case": case, "regular_tokens": r["regular_tokens"], "extra_tokens": r["registers"],
            "token_ratio": tok_ratio, "ms": r["median_ms"], "samples_per_s": 1e3 * batch / r["median_ms"],
            "time_ratio": t_ratio, "time_over_token_ratio": t_ratio / tok_ratio, "peak_mb": r["peak_mb"],
            "memory_ratio": r["peak_mb"] / plain["peak_mb"] if plain["peak_mb"] > 0 else float("nan"),
            "loss": r["loss"]}


def markdown(rows: list[dict], title: str) -> str:
    head = ("| case | regular tokens | extra tokens | token ratio | ms/step | samples/s | time / plain "
            "| time ratio / token ratio | peak MB | memory / plain |")
    lines = [f"**{title}**", "", head, "|---|" + "---:|" * 9]
    for r in rows:
        lines.append(f"| {r['case']} | {r['regular_tokens']} | {r['extra_tokens']} | {r['token_ratio']:.3f} "
                     f"| {r['ms']:.1f} | {r['samples_per_s']:.2f} | {r['time_ratio']:.3f} "
                     f"| {r['time_over_token_ratio']:.3f} | {r['peak_mb']:.1f} | {r['memory_ratio']:.3f} |")
    return "\n".join(lines)


def run_shape(model: dict, batch: int, prompt: int, answer: int, args, cases=CASES, say=print) -> list[dict]:
    runs: dict = {c: [] for c in cases}
    for rnd in range(args.rounds):
        # alternate the order, so that a change in machine load hits every case alike
        for case in cases if rnd % 2 == 0 else cases[::-1]:
            spec = dict(case=case, answer_length=answer, prompt_length=prompt, batch_size=batch,
                        repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=0, d_max=4,
                        loss_weight=0.3, model=model, fixed_registers=args.fixed_registers or max(1, answer // 4),
                        device=args.device, loss_chunk=args.loss_chunk)
            r = run_case(spec) if args.isolation == "inprocess" else run_case_subprocess(spec)
            runs[case].append(r)
            say(f"#   {case:<12s} batch {batch} x {prompt}+{answer} round {rnd}: {r['median_ms']:9.1f} ms  "
                f"peak +{r['peak_mb']:.1f} MB ({r['registers']} extra tokens)")
    results = {c: merge_rounds(rs) for c, rs in runs.items()}
    return [_row(c, results[c], results["plain"], batch) for c in cases]


def main(argv: Optional[list[str]] = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the CI smoke run)")
    p.add_argument("--gpu", action="store_true", help="~1B Llama in bf16 with flex_attention at 512/2048/8192 tokens")
    p.add_argument("--throughput", action="store_true", help="also batch 10 x 512 tokens: samples/s vs official-style")
    p.add_argument("--answer", type=int, default=512, help="answer tokens per row on CPU (prompt 64)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--fixed-registers", type=int, default=None, help="mutor_fixed registers per row (default A/4)")
    p.add_argument("--loss-chunk", type=int, default=None,
                   help="loss_chunk_size=N for every case but official (default: off; --gpu: 1024)")
    p.add_argument("--attn", choices=["sdpa", "eager", "flex_attention"], default=None,
                   help="attention implementation (default: sdpa on CPU, flex_attention with --gpu)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every case this many times (fresh processes, order alternating) and take the median "
                        "over all timed steps: on a noisy machine, 3 gives ratios that a single pass does not")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu (default) or cuda")
    p.add_argument("--isolation", choices=["subprocess", "inprocess"], default="subprocess")
    p.add_argument("--markdown-out", type=Path, default=None)
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    env = environment()
    print(f"# benchmark suite: {env['cpu']}, {env['nproc']} CPUs, torch {env['torch']}, "
          f"transformers {env['transformers']}", flush=True)
    shapes = []
    if args.tiny:
        model = dict(PRESETS["tiny"], attn=args.attn or "sdpa", dtype="float32")
        shapes.append(("tiny", model, 2, 8, 16))
    elif args.gpu:
        args.device = args.device or "cuda"
        model = dict(GPU_MODEL, attn=args.attn or "flex_attention", dtype="bfloat16")
        args.loss_chunk = args.loss_chunk or 1024
        shapes += [(f"GPU 1B bf16, seq {n}", model, max(1, 8192 // n), 64, n - 64) for n in (512, 2048, 8192)]
    else:
        model = dict(PRESETS["default"], attn=args.attn or "sdpa", dtype="float32")
        shapes.append((f"CPU small Llama, batch {args.batch} x (64 + {args.answer})", model, args.batch, 64,
                       args.answer))
    if args.throughput:
        shapes.append(("throughput: batch 10 x 512 tokens", shapes[0][1], 10, 64, 448))
    tables, all_rows = [], []
    for title, model, batch, prompt, answer in shapes:
        print(f"# {title}", flush=True)
        rows = run_shape(model, batch, prompt, answer, args)
        tables.append(markdown(rows, title))
        all_rows.append({"shape": title, "batch": batch, "prompt": prompt, "answer": answer, "model": model,
                         "rows": rows})
    text = "\n\n".join(tables)
    print()
    print(text)
    for s in all_rows:
        by = {r["case"]: r for r in s["rows"]}
        if "official" in by and "mutor" in by:
            speedup = by["mutor"]["samples_per_s"] / by["official"]["samples_per_s"]
            print(f"\n{s['shape']}: mutor {by['mutor']['samples_per_s']:.2f} samples/s vs official-style "
                  f"{by['official']['samples_per_s']:.2f}: {speedup:.1f}x")
    if args.markdown_out:
        args.markdown_out.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_out.write_text(text + "\n")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"environment": env, "shapes": all_rows}, indent=2) + "\n")
    return all_rows


if __name__ == "__main__":
    main()
