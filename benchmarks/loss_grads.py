"""Time and memory the chunked loss saves by computing only the gradients that are needed.

    python -m benchmarks.loss_grads                         # hidden 2048, vocab 256000, 256 rows, bf16
    python -m benchmarks.loss_grads --rows 64 --vocab 32000 --hidden 256 --rounds 1   # seconds

The shape is a LoRA fine-tune of a 256k-vocabulary model (Gemma 2B: hidden 2048, vocabulary
256,000, bf16): the output layer is frozen, the hidden states at the loss rows require grad. Four
cases, each in a fresh process (``--rounds N``: N times, order alternating), on the same rows:

* ``train/before``, ``eval/before``: the baseline, a chunked loss that computes every gradient
  (``mutor.core.loss`` of commit 720178a, copied verbatim below, :func:`_before_class`): in the
  forward, whatever needs them, ``dL/dhidden`` (N, C), the fp32 ``dL/dweight`` (V, C) and its cast to
  the weight's dtype, under ``torch.no_grad`` as well, with fresh ``(chunk, V)`` tensors per chunk.
* ``train/after``: ``fused_linear_cross_entropy`` with the weight frozen, forward + backward;
* ``eval/after``: ``fused_linear_cross_entropy`` under ``torch.no_grad`` (Trainer evaluation).

Time: wall clock and process CPU time of one step (forward, and backward for train), median over
``--repeats`` steps after ``--warmup``. Memory: the peak RSS growth of the process during the timed
steps (``benchmarks.step_time.PeakRSS``: ``malloc_trim``, reset ``VmHWM``, then ``VmHWM - RSS``),
i.e. everything the step allocates beyond the weight and the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

from benchmarks.step_time import REPO_ROOT, PeakRSS

RESULT_TAG = "@@LOSS_GRADS_RESULT "
CASES = ["train/before", "train/after", "eval/before", "eval/after"]


def _before_class():
    """The baseline: a chunked loss's autograd Function that computes every gradient (torch is imported in
    workers only)."""
    import torch

    class _FusedLinearCE(torch.autograd.Function):
        # verbatim mutor.core.loss._FusedLinearCE of commit 720178a
        @staticmethod
        def forward(ctx, hidden, weight, bias, targets, row_weight, softcap, chunk: int):
            N = hidden.shape[0]
            ce = torch.empty(N, dtype=torch.float32, device=hidden.device)
            hit = torch.empty(N, dtype=torch.bool, device=hidden.device)
            grad_h = torch.empty_like(hidden)                                              # (N, C)
            grad_w = torch.zeros_like(weight, dtype=torch.float32)                         # (V, C)
            grad_b = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
            for s in range(0, N, chunk):
                h = hidden[s:s + chunk]                                                    # (n, C)
                tgt = targets[s:s + chunk]
                z = h @ weight.t()                                                         # (n, V)
                if bias is not None:
                    z = z + bias
                z = z.float()
                if softcap:
                    t = torch.tanh(z / softcap)
                    logits = t * softcap
                else:
                    logits = z
                m = logits.amax(-1, keepdim=True)                                          # (n, 1)
                tl = logits.gather(1, tgt[:, None]).squeeze(1)                             # (n,)
                hit[s:s + chunk] = tl >= m[:, 0]
                g = logits.sub_(m).exp_()                                                  # (n, V)
                total = g.sum(-1, keepdim=True)                                            # (n, 1)
                ce[s:s + chunk] = (m + total.log())[:, 0] - tl
                w = row_weight[s:s + chunk]
                g.mul_(w[:, None] / total)                                                 # w * softmax
                g[torch.arange(len(tgt), device=g.device), tgt] -= w                       # w * (softmax - onehot)
                if softcap:
                    g *= 1.0 - t * t                                                       # through tanh soft-capping
                g_lp = g.to(h.dtype)
                grad_h[s:s + chunk] = g_lp @ weight
                grad_w += (g_lp.t() @ h).float()
                if grad_b is not None:
                    grad_b += g.sum(0)
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype),
                                  None if grad_b is None else grad_b.to(bias.dtype))
            ctx.has_bias = bias is not None
            loss = (ce * row_weight).sum()
            ctx.mark_non_differentiable(ce, hit)
            return loss, ce, hit

        @staticmethod
        def backward(ctx, g_loss, _g_ce, _g_hit):
            grad_h, grad_w, grad_b = ctx.saved_tensors
            return (grad_h * g_loss.to(grad_h.dtype), grad_w * g_loss.to(grad_w.dtype),
                    grad_b * g_loss.to(grad_b.dtype) if ctx.has_bias else None, None, None, None, None)

    return _FusedLinearCE


def run_case(spec: dict) -> dict:
    import torch

    from mutor.core.loss import fused_linear_cross_entropy

    before_fn = _before_class()
    torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(spec["vocab"], spec["hidden"], generator=g) * 0.02).to(dtype)          # frozen (V, C)
    hidden = torch.randn(spec["rows"], spec["hidden"], generator=g).to(dtype)                   # (N, C)
    targets = torch.randint(0, spec["vocab"], (spec["rows"],), generator=g)
    row_weight = torch.full((spec["rows"],), 1.0 / spec["rows"])
    chunk = spec["chunk"]

    mode, version = spec["case"].split("/")

    def step() -> float:
        h = hidden.detach().requires_grad_(mode == "train")
        with torch.set_grad_enabled(mode == "train"):
            if version == "before":
                loss = before_fn.apply(h, weight, None, targets, row_weight, None, chunk)[0]
            else:
                loss = fused_linear_cross_entropy(h, weight, None, targets, row_weight, None, chunk)[0]
        if mode == "train":
            loss.backward()
            assert h.grad is not None and h.grad.shape == h.shape
        return float(loss.detach())

    probe = PeakRSS()
    times, cpu, losses = [], [], []
    for i in range(spec["warmup"] + spec["repeats"]):
        if i == spec["warmup"]:
            probe.start()
        c0, t0 = time.process_time(), time.perf_counter()
        losses.append(step())
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if i >= spec["warmup"]:
            times.append(1e3 * dt)
            cpu.append(1e3 * dc)
    return {"case": spec["case"], "times_ms": times, "cpu_times_ms": cpu, "peak_mb": probe.peak_mb(),
            "peak_method": probe.method, "loss": losses[-1],
            "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None}


def run_subprocess(spec: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec["threads"])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.loss_grads", "--worker", json.dumps(spec)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"loss_grads worker {spec['case']} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loss_grads", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=2048, help="hidden size C (default 2048, Gemma 2B)")
    p.add_argument("--vocab", type=int, default=256000, help="vocabulary size V (default 256000, Gemma)")
    p.add_argument("--rows", type=int, default=256, help="loss rows N (default 256)")
    p.add_argument("--chunk", type=int, default=128, help="loss_chunk_size (default 128)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weight and rows dtype")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--repeats", type=int, default=2, help="timed steps per process (default 2)")
    p.add_argument("--rounds", type=int, default=2, help="fresh processes per case, order alternating (default 2)")
    p.add_argument("--json-out", default=None, help="write every figure to this JSON file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        res = run_case(json.loads(args.worker))
        print(RESULT_TAG + json.dumps(res), flush=True)
        return res
    base = {k: getattr(args, k) for k in ("hidden", "vocab", "rows", "chunk", "dtype", "threads", "warmup", "repeats")}
    print(f"# chunked loss, frozen output layer: {base}, {args.rounds} round(s)", flush=True)
    runs: dict[str, list[dict]] = {c: [] for c in CASES}
    for rnd in range(args.rounds):
        for case in CASES if rnd % 2 == 0 else CASES[::-1]:
            r = run_subprocess(dict(base, case=case))
            runs[case].append(r)
            print(f"#   {case:<13s} round {rnd}: wall {', '.join(f'{t:.0f}' for t in r['times_ms'])} ms  "
                  f"cpu {', '.join(f'{t:.0f}' for t in r['cpu_times_ms'])} ms  peak +{r['peak_mb']:.0f} MB  "
                  f"loss {r['loss']:.6f}  load {r['loadavg_after'][0]:.2f}", flush=True)
    summary = {}
    for case, rs in runs.items():
        summary[case] = {"wall_ms": statistics.median(t for r in rs for t in r["times_ms"]),
                         "cpu_ms": statistics.median(t for r in rs for t in r["cpu_times_ms"]),
                         "peak_mb": statistics.median(r["peak_mb"] for r in rs), "loss": rs[-1]["loss"]}
    print("\n| case | wall ms | CPU ms | peak RSS growth MB |\n|---|---:|---:|---:|")
    for case, s in summary.items():
        print(f"| {case} | {s['wall_ms']:.0f} | {s['cpu_ms']:.0f} | {s['peak_mb']:.0f} |")
    for mode in ("train", "eval"):
        b, a = summary[f"{mode}/before"], summary[f"{mode}/after"]
        print(f"{mode}: after/before wall {a['wall_ms'] / b['wall_ms']:.3f}, CPU {a['cpu_ms'] / b['cpu_ms']:.3f}, "
              f"peak {a['peak_mb']:.0f} vs {b['peak_mb']:.0f} MB (saved {b['peak_mb'] - a['peak_mb']:.0f} MB)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": base, "rounds": runs, "summary": summary}, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
