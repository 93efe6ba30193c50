"""Registers as drafters, measured: acceptance per offset, tokens per forward and tokens/s against plain
greedy decoding and transformers' prompt-lookup decoding, in one run with the methods interleaved.

    python -m benchmarks.speculative --run runs/star-graph/mutor                # star-graph prompts
    python -m benchmarks.speculative --run runs/digits/mutor_1d --max-new-tokens 64   # digits: class token -> 64 codes
    python -m benchmarks.speculative --run RUN/checkpoint-375 --num-prompts 20 --dtype float32 bfloat16
    python -m benchmarks.speculative --run DIR --draft 2 3 4 auto --rounds 3 --json out.json

The prompts come from the run's own task (``recipe.yaml`` beside the model or in its parent): the held-out
star graphs (``--num-prompts`` of them), one class token per digit class, or the first test prompts of a
text task that ``mutor eval`` knows (gsm_symbolic, reasoning_gym, gsm8k with ``--data``, ...), decoded up to
eos. Every method decodes every prompt in turn (methods interleaved per prompt, rounds alternating their
order), so machine noise hits all of them alike; tokens/s is total new tokens over total decoding time.
A LoRA checkpoint is merged into its base first. Drafting (``K`` fixed, or ``auto``: the draft length
chosen per step) must return exactly the plain greedy tokens: asserted in float32; in bfloat16 / float16 a
forward of several rows may round a near-tie the other way (as batched decoding does), so there the prompts
whose tokens differ are counted instead (``prompts_differing``).

A run trained with a bidirectional prefix is decoded as ``mutor eval`` decodes it (the prompt encoded both
ways, ``mutor.eval.generation.greedy_generate``); transformers' prompt lookup only decodes causally, so for
such a run it is measured against transformers' causal greedy ``generate`` on the same prompts (its own
pair, ``greedy_causal``). Each ``--dtype`` is measured in turn. One thread by default (``--threads``); on a CPU
by default (``--device cuda`` decodes on a GPU: ``benchmarks/gpu_drafting.sh`` trains a gsm_symbolic run there
and measures it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _recipe(run: Path) -> dict:
    recipe_path = next((p for p in (run / "recipe.yaml", run.parent / "recipe.yaml") if p.exists()), None)
    if recipe_path is None:
        raise SystemExit(f"{run}: no recipe.yaml beside the model or in its parent; cannot tell its task")
    from mutor.run.recipe import load_recipe

    r = load_recipe(recipe_path)
    return {"data": dict(r.data or {}), "seed": r.seed}


def _prompts(run: Path, n: int, tok, data: str | None) -> tuple[list[list[int]], int, str, bool]:
    """(prompts, max_new_tokens suggested by the task, task name, whether to stop at eos) of the run's task."""
    recipe = _recipe(run)
    opts = dict(recipe.get("data") or {})
    task = opts.get("task")
    if task == "star_graph" and opts.get("render", "tokens") != "text":
        from mutor.data.star_graph import StarGraphShape, make_examples

        t = StarGraphShape.from_options(opts)
        seed = int(opts.get("data_seed", recipe.get("seed", 0)))
        test = make_examples(t, min(n, int(opts.get("num_test", 500))), seed=2 * seed + 1)   # the held-out split
        return [ex.prompt_ids() for ex in test], t.path_len, "star_graph", False
    if task == "digits":
        from mutor.image.tokens import ImageLayout

        levels = int(opts.get("levels", 8))
        lay = ImageLayout(codebook_size=levels, num_classes=10, height=8, width=8, levels=levels)
        return [[lay.class_token(c)] for c in range(10)][:n], lay.num_tokens, "digits", False
    from mutor.eval.benchmarks import BENCHMARKS
    from mutor.eval.harness import task_prompts

    bench_name = {"gsm_symbolic": "gsm_symbolic", "reasoning_gym": "reasoning_gym"}.get(task, opts.get("dataset", task))
    if bench_name not in BENCHMARKS:
        raise SystemExit(f"{run}: task {task!r}: not star_graph, digits or a task of mutor eval "
                         f"(known: {sorted(BENCHMARKS)})")
    prompts, bench = task_prompts(bench_name, tok, "test", data, n, model_path=str(run))
    return prompts, int(bench.template.max_new_tokens), bench_name, True


def _load(run: str, dtype: str, device: str = "cpu"):
    """The MuToR model (a LoRA adapter merged into its base) in ``dtype`` on ``device`` and the run's tokenizer
    (or None)."""
    from mutor import MuToRModel
    from mutor.eval.harness import load_drafter

    if (Path(run) / "tokenizer_config.json").is_file() or (Path(run) / "adapter_config.json").is_file():
        return load_drafter(run, dtype=dtype, device=device)
    from mutor.models.loading import resolve_dtype

    kw = {} if dtype == "auto" else {"dtype": resolve_dtype(dtype)}
    return MuToRModel.from_pretrained(run, **kw).to(device).eval(), None


def measure(run: str, drafts: list, num_prompts: int, max_new_tokens: int | None, rounds: int,
            lookup: int, dtype: str = "auto", data: str | None = None, device: str = "cpu") -> dict:
    from mutor.eval.generation import greedy_generate
    from mutor.eval.harness import run_info
    from mutor.generation import DraftPolicy, DraftStats, generate

    model, tok = _load(run, dtype, device)
    base = model.base_model
    prompts, task_len, task, stop = _prompts(Path(run), num_prompts, tok, data)
    new = max_new_tokens or task_len
    mode = run_info(run).get("prefix_attention", model.mutor_config.prefix_attention)
    eos = tok.eos_token_id if (stop and tok is not None) else None
    pad = (tok.pad_token_id if tok is not None and tok.pad_token_id is not None else 0)
    label = {k: f"registers_K{k}" for k in drafts}
    causal_pair = lookup and mode == "bidirectional"
    methods = ["greedy"] + (["greedy_causal"] if causal_pair else []) + \
              ([f"prompt_lookup_{lookup}"] if lookup else []) + [label[k] for k in drafts]
    seconds = {m: 0.0 for m in methods}
    differing = {m: 0 for m in methods}
    half = next(base.parameters()).dtype in (torch.bfloat16, torch.float16)
    tokens = {m: 0 for m in methods}
    stats = {k: DraftStats() for k in drafts}
    # one per split, as mutor eval
    choosers = {k: DraftPolicy(model.mutor_config.d_max) for k in drafts if k == "auto"}
    kw = dict(do_sample=False, max_new_tokens=new, pad_token_id=pad, eos_token_id=eos)
    if eos is None:
        kw["min_new_tokens"] = new

    def cut(row: list[int]) -> list[int]:
        return row[:row.index(eos) + 1] if eos is not None and eos in row else row

    def decode(m: str, p: list[int], r: int) -> list[int]:
        ids = torch.tensor([p], device=device)
        if m == "greedy" and mode == "bidirectional":
            out = greedy_generate(base, [p], new, pad_id=pad, eos_id=eos, prefix_attention="bidirectional")[0]
            return out + ([eos] if eos is not None and len(out) < new else [])
        if m in ("greedy", "greedy_causal"):
            return base.generate(ids, **kw)[0, len(p):].tolist()
        if m.startswith("prompt_lookup"):
            return base.generate(ids, prompt_lookup_num_tokens=lookup, **kw)[0, len(p):].tolist()
        k = next(k for k, v in label.items() if v == m)
        out, st = generate(model, ids, max_new_tokens=new, draft_registers=choosers.get(k, k),
                           eos_token_id=[] if eos is None else eos, prefix_attention=mode)
        if r == 0:
            stats[k].add(st)
        return out[0, len(p):].tolist()

    with torch.no_grad():
        for m in methods:
            decode(m, prompts[0], 1)                                                 # warm-up, not counted
        for r in range(rounds):
            for p in prompts:
                outs = {}
                for m in (methods if r % 2 == 0 else methods[::-1]):
                    t0 = time.perf_counter()
                    outs[m] = cut(decode(m, p, r))
                    seconds[m] += time.perf_counter() - t0
                    tokens[m] += len(outs[m])
                own = [m for m in methods if m not in ("greedy_causal",) and not m.startswith("prompt_lookup")]
                causal = ["greedy_causal"] + [m for m in methods if m.startswith("prompt_lookup")] if causal_pair \
                    else [m for m in methods if m.startswith("prompt_lookup")] and ["greedy"] + \
                    [m for m in methods if m.startswith("prompt_lookup")]
                for group in (own, causal or []):
                    for m in group[1:]:
                        if outs[m] != outs[group[0]]:
                            if not half:
                                raise AssertionError(f"{m} decoded other tokens than {group[0]} on prompt {p}")
                            differing[m] += r == 0
    rows = []
    for m in methods:
        ref = "greedy_causal" if (m.startswith("prompt_lookup") and causal_pair) else "greedy"
        row = {"method": m, "tokens_per_s": round(tokens[m] / seconds[m], 2),
               "speedup_vs_greedy": round(tokens[m] / seconds[m] / (tokens[ref] / seconds[ref]), 3),
               "against": ref, "prompts_differing": differing[m]}
        if m.startswith("registers_K"):
            k = next(k for k, v in label.items() if v == m)
            row.update(stats[k].to_dict())
            if k in choosers:
                row["chooser_state"] = choosers[k].state()                             # why it drafted as it did
        rows.append(row)
    where = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else str(device)
    return {"run": run, "task": task, "device": where, "prompts": len(prompts), "max_new_tokens": new, "rounds": rounds,
            "threads": torch.get_num_threads(), "dtype": dtype, "prefix_attention": mode,
            "stop_at_eos": eos is not None, "rows": rows}


def markdown(res: dict) -> str:
    budget = "up to eos, at most" if res.get("stop_at_eos") else "x"
    lines = [f"{res['run']} ({res['task']}, {res['prompts']} prompts {budget} {res['max_new_tokens']} new tokens, "
             f"{res['rounds']} rounds, {res['threads']} thread(s), {res.get('dtype', 'auto')}, "
             f"{res.get('prefix_attention', 'causal')} prefix)", "",
             "| method | tokens/s | vs greedy | tokens per forward | acceptance per offset | forwards per K | "
             "prompts differing (half precision) |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        acc = ", ".join(f"{d} {a:.2f}" for d, a in r.get("acceptance", {}).items()) or "-"
        rounds = ", ".join(f"{k}: {n}" for k, n in r.get("rounds", {}).items()) or "-"
        tpf = f"{r['tokens_per_forward']:.2f}" if "tokens_per_forward" in r else (
            "1.00" if r["method"].startswith("greedy") else "-")
        vs = f"{r['speedup_vs_greedy']:.2f}x" + (" (vs causal)" if r.get("against") == "greedy_causal" else "")
        lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {vs} | {tpf} | {acc} | {rounds} | "
                     f"{r.get('prompts_differing', 0)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, nargs="+", help="MuToR checkpoint directories (model + sidecar)")
    p.add_argument("--draft", nargs="+", default=["2", "3", "4", "auto"],
                   help="K values (drafts for offsets 2..K) and/or 'auto' (draft length chosen per step)")
    p.add_argument("--dtype", nargs="+", default=["auto"], help="dtypes to measure in turn, e.g. float32 bfloat16")
    p.add_argument("--data", default=None, help="the task's test data file, where the task reads one (gsm8k)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's answer length")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lookup", type=int, default=3, help="prompt_lookup_num_tokens (0: skip)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where to decode (cpu, cuda): model and prompts go there; each "
                   "decoding is timed until its tokens are back on the host, so a GPU's queued work is counted")
    p.add_argument("--json", default=None, help="append the results as JSON lines to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    drafts = [k if k == "auto" else int(k) for k in args.draft]
    for run in args.run:
        for dtype in args.dtype:
            res = measure(run, drafts, args.num_prompts, args.max_new_tokens, args.rounds, args.lookup, dtype,
                          args.data, args.device)
            print(markdown(res), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
