"""Registers as drafters on a trained MuToR checkpoint: acceptance and wall-clock tokens/s.

One process, one thread setting, the same test prompts for every decoder, each at batch size 1:
plain greedy decoding (``mutor.eval.generation.greedy_generate``, the model's KV cache), and through
``mutor.generate`` K = 1 (plain decoding on the drafting code path: its own
overhead), register drafting with K = 2 .. d_max, and the draft length chosen per step (``"auto"``). The
decoders take turns on each prompt, so that a change in the machine's load (other runs beside this one) slows
them alike, in the orders of a Williams design (:mod:`mutor.eval.timing`), one per prompt in turn, so that each
decoder follows every other equally often (a rotation made one decoder always follow the same one, whose
leftovers, a cache or freed memory, it then always met). A LoRA checkpoint is merged into its
base once, for all of them. Every decoder's tokens are compared with greedy's: drafting is lossless, so in
float32 they must be equal; in bfloat16 a forward of several rows may round differently from one of a single
row, and a near-tie may then go the other way (``prompts_differing_from_greedy`` counts them, K = 1
included) and the outputs' lengths differ: ``speedup_vs_greedy`` is the ratio of seconds on the same prompts,
``tokens_per_s_vs_greedy`` that of emitted tokens per second (the two agree where the outputs do), and
``speedup_ci95`` a 95 % bootstrap interval of the former over the prompts (the seconds of each prompt are kept
in ``per_prompt_seconds``, to pool measurements); ``auto``'s row keeps its chooser's end state (what it measured a
forward of each size to cost, its acceptance estimates, its choice). One JSON object is printed (and written to
``--output``)::

    python experiments/evidence/drafting.py runs/evidence/rg-maze/mutor_s0/checkpoint-125 \
        --task reasoning_gym --limit 20 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from mutor.eval.timing import bootstrap_ratio, williams_orders


def measure(ckpt: Path, task: str, limit: int, dtype: str = "float32", ks: list | None = None,
            max_new_tokens: int | None = None, data: str | None = None, split: str = "test") -> dict:
    from mutor.eval.generation import greedy_generate
    from mutor.eval.harness import load_drafter, run_info, task_prompts
    from mutor.generation import DraftPolicy, DraftStats, generate

    mode = run_info(str(ckpt)).get("prefix_attention", "causal")
    if task == "run":                                  # a synthetic task from the run's recipe: star graphs
        model, prompts, longest, eos, pad = _star_graph(ckpt, dtype, split, limit)
    else:
        model, tok = load_drafter(str(ckpt), dtype=dtype, device="cpu")                 # a LoRA adapter merged
        prompts, bench = task_prompts(task, tok, split, data, limit, model_path=str(ckpt))
        longest, eos, pad = bench.template.max_new_tokens, tok.eos_token_id, tok.pad_token_id
    n_new = int(max_new_tokens or longest)
    d_max = model.mutor_config.d_max
    ks = ks or [*range(1, d_max + 1), "auto"]

    def cut(row):
        return row[:row.index(eos)] if eos in row else row

    def greedy(p):
        return greedy_generate(model.base_model, [p], n_new, pad_id=pad, eos_id=eos, prefix_attention=mode)[0]

    stats = {k: [] for k in ks}

    choosers = {}                                                     # auto's, whose end state the row keeps

    def drafter(k):
        drafts = choosers[k] = DraftPolicy(d_max) if k == "auto" else k   # one policy for all prompts, as mutor eval

        def draft(p):
            out, st = generate(model, torch.tensor([p]), n_new, drafts, eos_token_id=[] if eos is None else eos,
                               prefix_attention=mode)
            stats[k].append(st)
            return cut(out[0, len(p):].tolist())
        return draft

    decoders = {"greedy": greedy, **{f"K={k}": drafter(k) for k in ks}}
    outs = {name: [] for name in decoders}
    machine = _Machine()
    with torch.no_grad():
        for fn in decoders.values():
            fn(prompts[0])                                                  # warm-up, not counted
        for k in ks:
            stats[k].clear()                                                # the warm-up's stats dropped
        names, orders = list(decoders), williams_orders(len(decoders))
        per_prompt = {name: [] for name in names}
        for i, p in enumerate(prompts):                # decoders interleaved per prompt (a change of machine load
            for j in orders[i % len(orders)]:          # hits all alike), each following every other equally often
                t0 = time.perf_counter()
                outs[names[j]].append(decoders[names[j]](p))
                per_prompt[names[j]].append(time.perf_counter() - t0)
        secs = {name: sum(t) for name, t in per_prompt.items()}
    n_tok = sum(len(g) for g in outs["greedy"])
    g_sec = secs["greedy"]
    result = {"checkpoint": str(ckpt), "drafting_code": _code(), "task": task, "split": split, "prompts": len(prompts),
              "max_new_tokens": n_new, "dtype": dtype, "threads": torch.get_num_threads(), "prefix_attention": mode,
              "d_max": d_max, "timing": "interleaved per prompt, Williams orders", "machine": machine.read(),
              "greedy": {"new_tokens": n_tok, "seconds": round(g_sec, 2), "tokens_per_s": round(n_tok / g_sec, 2),
                         "per_prompt_seconds": [round(t, 4) for t in per_prompt["greedy"]]},
              "drafting": {}}
    for k in ks:
        total = DraftStats()
        for st in stats[k]:
            total.add(st)
        name, sec = f"K={k}", secs[f"K={k}"]
        n_out = sum(len(o) for o in outs[name])                             # emitted tokens without eos, as greedy's
        differ = sum(o != g for o, g in zip(outs[name], outs["greedy"]))
        result["drafting"][name] = {**total.to_dict(), "seconds": round(sec, 2), "tokens_per_s": round(n_out / sec, 2),
                                    "speedup_vs_greedy": round(g_sec / sec, 3),
                                    "speedup_ci95": bootstrap_ratio(per_prompt["greedy"], per_prompt[name]),
                                    "per_prompt_seconds": [round(t, 4) for t in per_prompt[name]],
                                    "tokens_per_s_vs_greedy": round(n_out / sec / (n_tok / g_sec), 3),
                                    "identical_to_greedy": differ == 0,
                                    "prompts_differing_from_greedy": differ,
                                    **({"chooser_state": choosers[k].state()} if k == "auto" else {})}
    return result


class _Machine:
    """How busy the machine was while the decoders ran, besides this process: a drafting row measured beside
    training runs reads differently from one on a quiet machine (docs/drafting.md). ``others_cpu_cores``: the CPU
    time every other process used (Linux ``/proc/stat``), per second of the measurement; ``load_average``: the
    1-minute load average (this process counts 1) at the start and the end."""

    def __init__(self):
        self.t0, self.busy0, self.own0, self.load0 = time.perf_counter(), _busy_seconds(), time.process_time(), _load()

    def read(self) -> dict:
        wall, busy = time.perf_counter() - self.t0, _busy_seconds()
        others = None if busy is None or self.busy0 is None else \
            max(0.0, (busy - self.busy0) - (time.process_time() - self.own0)) / max(wall, 1e-9)
        return {"cpus": os.cpu_count(), "others_cpu_cores": None if others is None else round(others, 2),
                "load_average": [self.load0, _load()]}


def _busy_seconds():
    """Seconds of CPU time every core has spent busy since boot (None where ``/proc/stat`` is not readable)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)                     # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")                   # guest time is inside user's


def _load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _star_graph(ckpt: Path, dtype: str, split: str, limit: int):
    """``--task run`` on a ``star_graph`` run: ``(model, prompts, max_new_tokens, eos, pad)`` for the first
    ``limit`` of its held-out graphs (those ``mutor eval --task run`` scores). Rendered as text: the run's
    tokenizer, up to eos, the evaluation's budget (the longest path + eos); as node ids: the path's nodes."""
    from mutor.data.star_graph import StarGraphShape, make_examples
    from mutor.eval.harness import load_drafter
    from mutor.methods.mutor import MuToRModel
    from mutor.models.loading import resolve_dtype
    from mutor.run.recipe import load_recipe

    path = next((d / "recipe.yaml" for d in (ckpt, ckpt.parent) if (d / "recipe.yaml").is_file()), None)
    if path is None:
        raise SystemExit(f"{ckpt}: no recipe.yaml here or in the parent; --task run reads the run's task from it")
    recipe = load_recipe(path)
    opts = dict(recipe.data or {})
    if opts.get("task") != "star_graph" or split != "test":
        raise SystemExit(f"{ckpt}: --task run measures star_graph runs on their held-out graphs (--split test); "
                         f"this run's task is {opts.get('task')!r}")
    shape = StarGraphShape.from_options(opts)
    test = make_examples(shape, int(opts.get("num_test", 500)), seed=2 * int(opts.get("data_seed", recipe.seed)) + 1)
    if opts.get("render") != "text":
        model = MuToRModel.from_pretrained(ckpt, dtype=resolve_dtype(dtype)).eval()
        return model, [ex.prompt_ids() for ex in test[:limit]], shape.path_len, None, 0
    from mutor.data.star_graph_text import render

    model, tok = load_drafter(str(ckpt), dtype=dtype, device="cpu")
    longest = max(len(tok(render(ex)[1], add_special_tokens=False)["input_ids"]) for ex in test) + 1
    prompts = [tok(render(ex)[0], add_special_tokens=True)["input_ids"] for ex in test[:limit]]
    return model, prompts, longest, tok.eos_token_id, tok.pad_token_id


def _code() -> str:
    """The commit of the mutor these numbers were measured with (the driver's row records its own, which
    differs when a drafting.json was measured by hand with newer code)."""
    import subprocess

    import mutor

    here = Path(mutor.__file__).resolve().parent
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--task", required=True, help="an evaluation task of mutor eval, or run (a star_graph run "
                                                  "rendered as text: its held-out graphs)")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", action="append", default=None, help="draft lengths: integers or 'auto' "
                                                               "(default: 1..d_max and auto)")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--data", default=None, help="the task's test data file, where the task reads one")
    ap.add_argument("--split", default="test", help="the prompts' split: test (the rows), or validation "
                                                    "(to try a change to drafting without looking at test prompts)")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    ks = [k if k == "auto" else int(k) for k in args.k] if args.k else None
    res = measure(args.checkpoint, args.task, args.limit, args.dtype, ks, args.max_new_tokens, args.data, args.split)
    text = json.dumps(res)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
