"""Step time of each method in each training precision, on a real recipe (default: SmolLM2-135M, LoRA r=32).

    python -m benchmarks.precision --threads 2 --json-out benchmarks/precision_2026-11-23.json
    python -m benchmarks.precision --recipe tiny/gsm8k --steps 2      # seconds: the smoke test

The recipe's own model, LoRA, prefix attention, ``loss_chunk_size`` and first training batch (its data
order for ``seed``); for every precision x method one optimizer step is timed as training takes it:
forward, backward, clipping as ``mutor train`` does it by default (model and method parameters apart),
AdamW step, ``zero_grad``. Precisions:

* ``fp32``: float32 weights and compute;
* ``bf16``: bf16 base weights (LoRA adapters and the method's own parameters stay float32:
  peft's ``autocast_adapter_dtype`` and :func:`mutor.methods.base.master_dtype`);
* ``autocast``: float32 weights, computed under ``torch.autocast(bfloat16)`` (what ``training.bf16: true``
  gives through Trainer);
* ``bf16+autocast``: bf16 base weights *and* autocast (``model.dtype: bfloat16`` with ``training.bf16:
  true``): the float32 LoRA adapters then multiply in bf16 too, and the copy of each adapter's input that
  peft casts to float32 is not what autograd keeps.

Besides time, one extra forward records the MiB of activations autograd saves for backward (distinct
storages other than the weights; ``benchmarks.step_time.saved_tensor_mb``): under bf16 weights with float32
adapters, peft saves a float32 copy of every adapted layer's input next to the bf16 one.

Every case builds its model afresh in a process of its own (same seed; ``--in-process`` for smoke runs), runs
``--warmup`` untimed steps, then ``--steps`` timed ones; the median is reported, and its ratio to the fp32
next-token step. Cases run in
the order precision-major; ``--rounds 2`` repeats the whole grid in reverse order and takes the median of
both, so a machine whose load drifts favours no case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Optional

import torch

PRECISIONS = ("fp32", "bf16", "autocast", "bf16+autocast")
METHODS = ("next_token", "mutor", "multi_token")


def _setup(recipe_name: str, overrides: list[str]):
    from mutor.data.collator import make_collator
    from mutor.models.real import resolve_model_args
    from mutor.run.build import build_tokenizer
    from mutor.run.recipe import load_recipe
    from mutor.run.train import build_task

    r = load_recipe(recipe_name, overrides)
    r.model = resolve_model_args(r.model, lora=bool(r.lora))
    tok = build_tokenizer(r.model)
    task = build_task(r, tok)
    bs = int(r.training.get("per_device_train_batch_size", 8))
    rows = [task.train_dataset[i] for i in range(bs)]
    batch = make_collator(task.pad_token_id, r.data.get("packing", task.packing))(rows)
    return r, task, tok, batch


def time_case(r, task, tok, batch, method: str, precision: str, warmup: int, steps: int) -> dict:
    from mutor.integrations.clipping import clip_group
    from mutor.methods.registry import get_method
    from mutor.run.build import apply_lora, build_base_model

    r = r.for_method(method)
    r.model.dtype = "bfloat16" if precision.startswith("bf16") else "float32"
    torch.manual_seed(r.seed)
    base = apply_lora(build_base_model(r.model, task, tok, r.seed, r.register_reach()), r.lora)
    model = get_method(method).wrap(base, r.method_config(method, task.mutor_overrides), r.loss_chunk_size).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    groups = model.parameter_groups() if hasattr(model, "parameter_groups") else (params, [])
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if "autocast" in precision else contextlib.nullcontext
    times, losses = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with ctx():
            out = model(**batch)
        out.loss.backward()
        for g in groups:
            clip_group(g, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(out.loss))
    from benchmarks.step_time import saved_tensor_mb

    def forward(backward=False):
        with ctx():
            return model(**batch).loss

    saved = saved_tensor_mb(forward, list(model.parameters()))
    return {"method": method, "precision": precision, "seconds": times, "median_s": statistics.median(times),
            "first_loss": losses[0], "saved_mb": round(saved, 1)}


def _isolated_case(recipe: str, overrides: list[str], threads: Optional[int], method: str, precision: str,
                   warmup: int, steps: int) -> dict:
    """One case in a fresh process: its memory is returned when it ends, and no case's allocations or
    warm caches reach the next (in one process a 135M model per case exhausted 24 GB after six cases)."""
    if threads:
        torch.set_num_threads(threads)
    r, task, tok, batch = _setup(recipe, overrides)
    return time_case(r, task, tok, batch, method, precision, warmup, steps)


def table(rows: list[dict]) -> str:
    """The Markdown table of benchmarks/RESULTS.md: each case against the same method in fp32 and fp32 next-token."""
    med = {(x["precision"], x["method"]): x["median_s"] for x in rows}
    ref = med.get(("fp32", "next_token"))

    def ratio(v: float, base: Optional[float]) -> str:
        return f"{v / base:.2f}x" if base else "-"

    out = ["| precision | method | s / step | vs the same method in fp32 | vs fp32 next-token | saved activations MiB "
           "| first loss |", "|---|---|---:|---:|---:|---:|---:|"]
    for x in rows:
        s = x["median_s"]
        out.append(f"| {x['precision']} | {x['method']} | {s:.2f} | {ratio(s, med.get(('fp32', x['method'])))} | "
                   f"{ratio(s, ref)} | {x['saved_mb']:.0f} | {x['first_loss']:.4f} |")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="real/smollm2-135m-gsm-symbolic")
    p.add_argument("--set", nargs="*", default=[], help="recipe overrides (key=value)")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json-out", default=None)
    p.add_argument("--table-from", default=None, metavar="JSON",
                   help="print the table of a saved --json-out file and exit")
    p.add_argument("--in-process", action="store_true",
                   help="run every case in this process (fast start, for smoke runs; memory grows case by case)")
    a = p.parse_args(argv)
    if a.table_from:
        with open(a.table_from) as f:
            print(table(json.load(f)["rows"]))
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    r, task, tok, batch = _setup(a.recipe, a.set)
    grid = [(pr, m) for pr in a.precisions for m in a.methods]
    results: dict = {}
    for k in range(a.rounds):
        for pr, m in (grid if k % 2 == 0 else grid[::-1]):
            if a.in_process:
                res = time_case(r, task, tok, batch, m, pr, a.warmup, a.steps)
            else:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                    res = pool.submit(_isolated_case, a.recipe, a.set, a.threads, m, pr, a.warmup, a.steps).result()
            results.setdefault((pr, m), []).append(res)
            print(f"round {k}: {pr:8s} {m:12s} {res['median_s']:.2f} s/step (first loss {res['first_loss']:.4f})",
                  flush=True)
    rows = []
    for (pr, m), rs in results.items():
        secs = [s for x in rs for s in x["seconds"]]
        rows.append({"precision": pr, "method": m, "median_s": statistics.median(secs), "seconds": secs,
                     "first_loss": rs[0]["first_loss"], "saved_mb": rs[0]["saved_mb"]})
    print("\n" + table(rows))
    if a.json_out:
        info = {"recipe": a.recipe, "overrides": a.set, "threads": torch.get_num_threads(), "warmup": a.warmup,
                "steps": a.steps, "rounds": a.rounds, "batch_shape": list(batch["input_ids"].shape),
                "torch": torch.__version__}
        with open(a.json_out, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
