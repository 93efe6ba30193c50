"""Step time and peak memory of MuToR training against the plain causal-LM loss, on CPU.

    python -m benchmarks.step_time                      # defaults: answers of 128 and 512 tokens
    python -m benchmarks.step_time --threads 1 --json-out runs/bench.json
    python -m benchmarks.step_time --tiny               # seconds; what the CI smoke test runs

For every answer length A the batch is ``B`` rows of ``prompt_length + A`` random tokens,
no padding, labels -100 on the prompt. Two cases run on the *same* batch and the *same*
seeded random-init Llama (built from ``LlamaConfig``, nothing is downloaded):

* ``plain``: ``base(input_ids, attention_mask, labels=labels).loss.backward()``; with
  ``--loss-chunk N`` it is next-token through the same chunked loss
  (``MuToRModel(base, MuToRConfig(loss_weight=0), loss_chunk_size=N)``, no registers), so the
  ratio measures the registers and nothing else
* ``mutor``: ``MuToRModel(base, MuToRConfig(d_max, loss_weight))(...).loss.backward()``

Time: forward + backward (``zero_grad(set_to_none=True)`` before each step, outside the
clock), ``--warmup`` untimed steps, then the median of ``--repeats`` timed steps (wall clock,
``perf_counter``). ``--rounds N`` repeats every case in N fresh processes, alternating the
plain/MuToR order, and takes the median over all N x repeats steps. The second table gives
the process CPU time (user + sys, ``process_time``) of the same steps, which other jobs on a
busy machine disturb less than wall time, and its kernel part (``ru_stime``): on Linux every
large tensor is a fresh ``mmap``, so each step pays one minor page fault per 4 KiB it
allocates, and that cost depends on the machine (it is high in VMs with free-page reporting).

Peak memory: every case runs in a fresh Python subprocess (``--isolation subprocess``, the
default), so no allocator state is shared between cases. In that process, after the
warm-up steps (with gradients set to None), freed heap is handed back to the kernel
(``malloc_trim``), the kernel's resident-set high-water mark is reset
(``echo 5 > /proc/self/clear_refs``) and the current RSS is taken as the baseline; the figure
reported is ``VmHWM - baseline`` after the timed steps, i.e. the largest growth of the
process's resident memory during a training step (activations and other saved tensors,
gradients, logits, masks, allocator overhead), excluding the model weights, the batch and
one-off start-up costs such as thread pools (with ``--warmup 0`` those are included). Where
``clear_refs`` cannot be written, ``ru_maxrss`` is used instead (flagged ``ru_maxrss`` in the
JSON; it can under-read if model construction peaked higher than the steps do).
``--isolation inprocess`` runs all cases in this process: faster (the smoke test uses it),
but the memory figures are then polluted by earlier cases and only indicative.

As a second, allocator-independent memory figure, one extra untimed forward records the bytes
of every distinct tensor storage other than the weights that autograd saves for backward
(``saved_tensors_hooks``); it is in the JSON and in the second table. It leaves out transient tensors
(logits before the loss, gradients), which the RSS peak includes.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_TAG = "@@STEP_TIME_RESULT "

PRESETS = {
    # name: hidden, layers, heads, intermediate, vocab
    "default": dict(hidden=256, layers=4, heads=4, intermediate=688, vocab=32000),
    "tiny": dict(hidden=32, layers=2, heads=2, intermediate=64, vocab=512),
}
TINY_RUN = dict(answer_lengths=[8, 16], prompt_length=8, batch_size=2, repeats=1, warmup=0)


# ----------------------------------------------------------------------------- memory probes
def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux >= 4.0). False when not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kb("VmHWM") is not None
    except OSError:
        return False


def _maxrss_kb() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r // 1024 if sys.platform == "darwin" else r  # bytes on macOS, KiB on Linux


class PeakRSS:
    """Largest RSS growth (MiB) of this process between ``start()`` and ``peak_mb()``."""

    def start(self) -> None:
        gc.collect()
        _malloc_trim()
        self.method = "VmHWM" if _reset_hwm() else "ru_maxrss"
        self.base_kb = _status_kb("VmRSS") if self.method == "VmHWM" else _maxrss_kb()

    def peak_mb(self) -> float:
        peak_kb = _status_kb("VmHWM") if self.method == "VmHWM" else _maxrss_kb()
        return max(peak_kb - self.base_kb, 0) / 1024.0


def saved_tensor_mb(step, params=()) -> float:
    """MiB of distinct tensor storages autograd saves for backward during ``step()`` (forward only),
    leaving out the storages of ``params`` (weights are resident anyway)."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[tuple, int] = {}

    def pack(t):
        if t.device.type == "cpu" and not getattr(t, "is_nested", False):
            try:
                s = t.untyped_storage()
                if s.data_ptr() not in skip:
                    seen[(s.data_ptr(), s.nbytes())] = s.nbytes()
            except (RuntimeError, NotImplementedError):
                seen[(id(t), t.numel())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step(backward=False)
    del loss
    return sum(seen.values()) / 2**20


# ----------------------------------------------------------------------------- one case
def build_model(spec: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    m = spec["model"]
    cfg = LlamaConfig(
        hidden_size=m["hidden"], intermediate_size=m["intermediate"], num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"], num_key_value_heads=m["heads"], vocab_size=m["vocab"],
        max_position_embeddings=max(2048, spec["prompt_length"] + spec["answer_length"] + 16),
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
        attn_implementation=m["attn"],
    )
    torch.manual_seed(spec["seed"])
    model = LlamaForCausalLM(cfg).to(dtype=getattr(torch, m["dtype"]))
    model.train()
    return model


def build_batch(spec: dict):
    import torch

    g = torch.Generator().manual_seed(spec["seed"] + 1)
    B, P, A = spec["batch_size"], spec["prompt_length"], spec["answer_length"]
    input_ids = torch.randint(3, spec["model"]["vocab"], (B, P + A), generator=g)
    attention_mask = torch.ones_like(input_ids)
    labels = input_ids.clone()
    labels[:, :P] = -100
    return input_ids, attention_mask, labels


def run_case(spec: dict) -> dict:
    """Build model and batch, warm up, time ``repeats`` steps; returns figures for one case."""
    import torch

    threads = torch.get_num_threads()
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    try:
        return _run_case(spec)
    finally:
        torch.set_num_threads(threads)  # matters in-process only


def _run_case(spec: dict) -> dict:
    import torch

    import mutor

    dev = torch.device(spec.get("device") or "cpu")
    cuda = dev.type == "cuda"
    if spec["case"] == "official" and spec["model"]["attn"] == "flex_attention":
        # the reference passes a dense additive float mask, which FlexAttention cannot take
        spec = dict(spec, model=dict(spec["model"], attn="sdpa"))
    base = build_model(spec).to(dev)
    input_ids, attention_mask, labels = (t.to(dev) for t in build_batch(spec))
    if spec["case"] == "plain" and spec.get("loss_chunk"):
        # the fair baseline for chunked MuToR: next-token with the same chunked loss (no registers)
        model = mutor.MuToRModel(base, mutor.MuToRConfig(loss_weight=0.0), loss_chunk_size=spec["loss_chunk"])

        def forward():
            return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss, 0
    elif spec["case"] == "plain":
        model = base

        def forward():
            out = base(input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False)
            return out.loss, 0
    elif spec["case"] in ("mutor", "mutor_dense"):
        mcfg = mutor.MuToRConfig(d_max=spec["d_max"], loss_weight=spec["loss_weight"], seed=spec["seed"])
        model = mutor.MuToRModel(base, mcfg, attention="dense" if spec["case"] == "mutor_dense" else "auto",
                                 loss_chunk_size=spec.get("loss_chunk"))

        def forward():
            out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            return out.loss, out.num_registers
    elif spec["case"] == "mutor_fixed":
        mcfg = mutor.MuToRConfig(d_max=spec["d_max"], loss_weight=spec["loss_weight"], seed=spec["seed"],
                                 num_registers=spec["fixed_registers"])
        model = mutor.MuToRModel(base, mcfg, loss_chunk_size=spec.get("loss_chunk"))

        def forward():
            out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            return out.loss, out.num_registers
    elif spec["case"] == "multi_token":
        from mutor.methods.multi_token import MultiTokenConfig, MultiTokenModel

        model = MultiTokenModel(base, MultiTokenConfig(d_max=spec.get("mt_d_max", 2), loss_weight=0.1),
                                loss_chunk_size=spec.get("loss_chunk"))

        def forward():
            out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            return out.loss, out.num_registers
    elif spec["case"] == "official":
        from mutor.testing.official_style import official_step

        reg = torch.nn.Parameter(torch.randn(base.config.hidden_size) * 0.02)
        model = torch.nn.ModuleDict({"base": base})
        model.register_parameter("register", reg)
        gen = torch.Generator().manual_seed(spec["seed"])

        def forward():      # backward happens inside, one example at a time, as the reference code does
            loss, regs = official_step(base, reg, input_ids, labels, spec["d_max"], spec["loss_weight"], gen)
            return torch.tensor(loss), regs
    else:
        raise ValueError(f"unknown case {spec['case']!r}")

    registers = 0

    def step(backward: bool = True):
        nonlocal registers
        loss, registers = forward()
        if backward and loss.requires_grad:
            loss.backward()
        return loss

    probe = PeakRSS()
    losses, times, cpu_times, sys_times = [], [], [], []
    for i in range(spec["warmup"] + spec["repeats"]):
        model.zero_grad(set_to_none=True)
        if i == spec["warmup"]:
            probe.start()  # after warm-up: one-off costs (thread pools, kernel caches) are not per-step memory
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                cuda0 = torch.cuda.memory_allocated()
        if cuda:
            torch.cuda.synchronize()
        s0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime, time.process_time(), time.perf_counter()
        loss = step()
        if cuda:
            torch.cuda.synchronize()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        ds = resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0
        losses.append(float(loss.detach()))
        del loss
        if i >= spec["warmup"]:
            times.append(dt)
            cpu_times.append(dc)
            sys_times.append(ds)
    peak = probe.peak_mb() if not cuda else (torch.cuda.max_memory_allocated() - cuda0) / 2**20
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / spec["repeats"]
    model.zero_grad(set_to_none=True)
    saved = saved_tensor_mb(step, list(model.parameters()))
    return {
        "case": spec["case"], "answer_length": spec["answer_length"],
        "regular_tokens": int(input_ids.numel()), "registers": int(registers),
        "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
        "times_ms": [1e3 * t for t in times], "cpu_median_ms": 1e3 * statistics.median(cpu_times),
        "cpu_times_ms": [1e3 * t for t in cpu_times], "sys_median_ms": 1e3 * statistics.median(sys_times),
        "peak_mb": peak, "peak_method": "cuda_max_allocated" if cuda else probe.method,
        "saved_mb": saved, "minor_faults_per_step": faults, "loss": losses[-1], "threads": torch.get_num_threads(),
        "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def run_case_subprocess(spec: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec["threads"])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.step_time", "--worker", json.dumps(spec)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"benchmark worker for {spec['case']} A={spec['answer_length']} failed "
                       f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def merge_rounds(results: list[dict]) -> dict:
    """One case over several rounds (fresh processes): medians over every timed step and over peaks."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    out["times_ms"] = [t for r in results for t in r["times_ms"]]
    out["cpu_times_ms"] = [t for r in results for t in r["cpu_times_ms"]]
    out["median_ms"] = statistics.median(out["times_ms"])
    out["min_ms"] = min(out["times_ms"])
    out["cpu_median_ms"] = statistics.median(out["cpu_times_ms"])
    for k in ("peak_mb", "saved_mb", "minor_faults_per_step", "sys_median_ms"):
        out[k] = statistics.median(r[k] for r in results)
    out["rounds"] = results
    return out


# ----------------------------------------------------------------------------- report
def summarize(plain: dict, mut: dict) -> dict:
    tok_ratio = (mut["regular_tokens"] + mut["registers"]) / mut["regular_tokens"]
    time_ratio = mut["median_ms"] / plain["median_ms"]
    mem_ratio = mut["peak_mb"] / plain["peak_mb"] if plain["peak_mb"] > 0 else float("nan")
    return {
        "answer_length": mut["answer_length"], "regular_tokens": mut["regular_tokens"],
        "registers": mut["registers"], "token_ratio": tok_ratio,
        "plain_ms": plain["median_ms"], "mutor_ms": mut["median_ms"], "time_ratio": time_ratio,
        "time_over_token_ratio": time_ratio / tok_ratio,
        "plain_peak_mb": plain["peak_mb"], "mutor_peak_mb": mut["peak_mb"], "memory_ratio": mem_ratio,
        "plain_cpu_ms": plain["cpu_median_ms"], "mutor_cpu_ms": mut["cpu_median_ms"],
        "cpu_time_ratio": mut["cpu_median_ms"] / plain["cpu_median_ms"],
        "plain_sys_ms": plain["sys_median_ms"], "mutor_sys_ms": mut["sys_median_ms"],
        "plain_faults_per_step": plain["minor_faults_per_step"], "mutor_faults_per_step": mut["minor_faults_per_step"],
        "plain_saved_mb": plain["saved_mb"], "mutor_saved_mb": mut["saved_mb"],
        "saved_ratio": mut["saved_mb"] / plain["saved_mb"] if plain["saved_mb"] > 0 else float("nan"),
        "time_target_met": time_ratio <= 1.1 * tok_ratio, "memory_target_met": mem_ratio <= tok_ratio,
        "plain": plain, "mutor": mut,
    }


TABLE_HEADER = ("| answer length | MuToR attention | regular tokens | registers | token ratio | plain ms | MuToR ms "
                "| time ratio | time ratio / token ratio | plain peak MB | MuToR peak MB | memory ratio |")


def markdown_table(rows: list[dict]) -> str:
    lines = [TABLE_HEADER, "|" + "---:|" * 12]
    for r in rows:
        lines.append(
            f"| {r['answer_length']} | {r.get('attention', 'split')} | {r['regular_tokens']} | {r['registers']} "
            f"| {r['token_ratio']:.3f} "
            f"| {r['plain_ms']:.1f} | {r['mutor_ms']:.1f} | {r['time_ratio']:.3f} "
            f"| {r['time_over_token_ratio']:.3f}{'' if r['time_target_met'] else ' ✗'} "
            f"| {r['plain_peak_mb']:.1f} | {r['mutor_peak_mb']:.1f} "
            f"| {r['memory_ratio']:.3f}{'' if r['memory_target_met'] else ' ✗'} |")
    return "\n".join(lines)


def diagnostics_table(rows: list[dict]) -> str:
    """Process CPU time (user+sys; less sensitive to other jobs than wall time), its kernel part (mostly page
    faults on fresh allocations), minor faults per step and bytes saved for backward."""
    lines = ["| answer length | MuToR attention | token ratio | plain CPU ms | MuToR CPU ms | CPU-time ratio "
             "| CPU-time ratio / token ratio | plain sys ms | MuToR sys ms | plain faults/step | MuToR faults/step "
             "| plain saved MB | MuToR saved MB | saved ratio |",
             "|" + "---:|" * 14]
    for r in rows:
        lines.append(f"| {r['answer_length']} | {r.get('attention', 'split')} | {r['token_ratio']:.3f} "
                     f"| {r['plain_cpu_ms']:.1f} | {r['mutor_cpu_ms']:.1f} "
                     f"| {r['cpu_time_ratio']:.3f} | {r['cpu_time_ratio'] / r['token_ratio']:.3f} "
                     f"| {r['plain_sys_ms']:.0f} | {r['mutor_sys_ms']:.0f} "
                     f"| {r['plain_faults_per_step']:.0f} | {r['mutor_faults_per_step']:.0f} "
                     f"| {r['plain_saved_mb']:.1f} | {r['mutor_saved_mb']:.1f} | {r['saved_ratio']:.3f} |")
    return "\n".join(lines)


def environment() -> dict:
    import torch
    import transformers

    from mutor.utils.devices import cpu_description

    cpu, _ = cpu_description()
    return {"cpu": cpu, "nproc": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}


# ----------------------------------------------------------------------------- CLI
def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--answer-lengths", type=int, nargs="+", default=None,
                   help="answer tokens per row (default 128 512)")
    p.add_argument("--prompt-length", type=int, default=None, help="prompt tokens per row, label -100 (default 64)")
    p.add_argument("--batch-size", type=int, default=None, help="rows per batch (default 8)")
    p.add_argument("--repeats", type=int, default=None, help="timed steps; the median is reported (default 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in every case (default: torch's)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model shape (default: 'default', a small Llama; --tiny selects 'tiny')")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 256)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 4)")
    p.add_argument("--heads", type=int, default=None, help="attention heads, no GQA (default 4)")
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 688)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32000)")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="attention implementation")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--attention", choices=["auto", "dense", "both"], default="auto",
                   help="MuToRModel attention: auto (split register rows under sdpa), dense (one (T+R)^2 mask), "
                        "or both, as two rows of the table")
    p.add_argument("--loss-chunk", type=int, default=None,
                   help="MuToRModel(loss_chunk_size=...): chunked projection + cross-entropy (default: off)")
    p.add_argument("--d-max", type=int, default=4, help="MuToRConfig.d_max")
    p.add_argument("--loss-weight", type=float, default=0.3, help="MuToRConfig.loss_weight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="run every case this many times (fresh processes, plain/MuToR order alternating) and take "
                        "the median over all timed steps and over the peaks: steadier figures on a busy machine")
    p.add_argument("--isolation", choices=["subprocess", "inprocess"], default="subprocess",
                   help="one fresh process per case (honest peak memory) or all in this process")
    p.add_argument("--tiny", action="store_true",
                   help="CI smoke size: tiny model, answers 8 16, prompt 8, batch 2, 1 repeat, no warm-up")
    p.add_argument("--json-out", type=Path, default=None, help="write every figure to this JSON file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        return args
    preset = PRESETS[args.preset or ("tiny" if args.tiny else "default")]
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    run_defaults = TINY_RUN if args.tiny else dict(answer_lengths=[128, 512], prompt_length=64, batch_size=8,
                                                    repeats=5, warmup=2)
    for k, v in run_defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.repeats < 1 or args.rounds < 1 or args.warmup < 0 or args.batch_size < 1 or args.prompt_length < 1:
        p.error("need --repeats >= 1, --rounds >= 1, --warmup >= 0, --batch-size >= 1, --prompt-length >= 1")
    if any(a < 1 for a in args.answer_lengths):
        p.error("--answer-lengths must be positive")
    return args


def main(argv: Optional[list[str]] = None) -> list[dict]:
    args = parse_args(argv)
    if args.worker is not None:
        res = run_case(json.loads(args.worker))
        print(RESULT_TAG + json.dumps(res), flush=True)
        return [res]

    model = {k: getattr(args, k) for k in ("hidden", "layers", "heads", "intermediate", "vocab", "attn", "dtype")}
    env = environment()
    print(f"# MuToR step-time benchmark: {env['cpu']}, {env['nproc']} CPUs, torch {env['torch']}, "
          f"transformers {env['transformers']}, threads={args.threads or 'default'}, isolation={args.isolation}")
    print(f"# model {model}; batch {args.batch_size} x (prompt {args.prompt_length} + answer); "
          f"MuToR d_max={args.d_max} loss_weight={args.loss_weight}; warmup {args.warmup}, median of "
          f"{args.repeats} x {args.rounds} round(s)",
          flush=True)
    rows = []
    for A in args.answer_lengths:
        variants = {"auto": ["mutor"], "dense": ["mutor_dense"], "both": ["mutor", "mutor_dense"]}[args.attention]
        cases = ["plain", *variants]
        runs: dict[str, list[dict]] = {c: [] for c in cases}
        for rnd in range(args.rounds):
            # alternate the order so that a change in machine load hits every case alike
            for case in cases if rnd % 2 == 0 else cases[::-1]:
                spec = dict(case=case, answer_length=A, prompt_length=args.prompt_length, batch_size=args.batch_size,
                            repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=args.seed,
                            d_max=args.d_max, loss_weight=args.loss_weight, model=model, loss_chunk=args.loss_chunk)
                r = run_case_subprocess(spec) if args.isolation == "subprocess" else run_case(spec)
                runs[case].append(r)
                print(f"#   A={A:<5d} {case:<11s} round {rnd}: median {r['median_ms']:8.1f} ms "
                      f"(runs {', '.join(f'{t:.0f}' for t in r['times_ms'])})  cpu {r['cpu_median_ms']:.0f} ms"
                      f"  peak +{r['peak_mb']:.1f} MB ({r['peak_method']})  saved {r['saved_mb']:.1f} MB"
                      f"  faults/step {r['minor_faults_per_step']:.0f}"
                      f"  load {r['loadavg_after'][0] if r['loadavg_after'] else float('nan'):.2f}", flush=True)
        res = {case: merge_rounds(rs) for case, rs in runs.items()}
        for v in variants:
            rows.append({**summarize(res["plain"], res[v]), "attention": "dense" if v == "mutor_dense" else "split"})
    print()
    print(markdown_table(rows))
    print()
    print(diagnostics_table(rows))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"argv": sys.argv[1:] if argv is None else list(argv), "environment": env,
                   "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "worker"},
                   "rows": rows}
        args.json_out.write_text(json.dumps(payload, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
