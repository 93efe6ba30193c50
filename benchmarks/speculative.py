"""Registers as drafters, measured: acceptance per offset, tokens per forward and tokens/s against plain
greedy ``generate`` and transformers' prompt-lookup decoding, in one run with the methods interleaved.

    python -m benchmarks.speculative --run runs/star-graph/mutor                # star-graph prompts
    python -m benchmarks.speculative --run runs/digits/mutor_1d --max-new-tokens 64   # digits: class token -> 64 codes
    python -m benchmarks.speculative --run DIR --draft 2 3 4 --rounds 3 --json out.json

The prompts come from the run's own task (``recipe.yaml`` beside the model): the held-out star graphs
(``--num-prompts`` of them), or one class token per digit class. Every method decodes every prompt in
turn (methods interleaved per prompt, rounds alternating their order), so machine noise hits all of
them alike; tokens/s is total new tokens over total decoding time. Drafting must return exactly the
plain greedy tokens (asserted here too). One thread by default (``--threads``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml


def _prompts(run: Path, n: int) -> tuple[list[list[int]], int, str]:
    """(prompts, max_new_tokens suggested by the task, task name) of the run's task."""
    recipe_path = next((p for p in (run / "recipe.yaml", run.parent / "recipe.yaml") if p.exists()), None)
    if recipe_path is None:
        raise SystemExit(f"{run}: no recipe.yaml beside the model or in its parent; cannot tell its task")
    recipe = yaml.safe_load(recipe_path.read_text())
    data = dict(recipe.get("data") or {})
    task = data.get("task")
    if task == "star_graph":
        from mutor.data.star_graph import StarGraphShape, make_examples

        t = StarGraphShape.from_options(data)
        seed = int(data.get("data_seed", recipe.get("seed", 0)))
        test = make_examples(t, min(n, int(data.get("num_test", 500))), seed=2 * seed + 1)   # the held-out split
        return [ex.prompt_ids() for ex in test], t.path_len, "star_graph"
    if task == "digits":
        from mutor.image.tokens import ImageLayout

        levels = int(data.get("levels", 8))
        lay = ImageLayout(codebook_size=levels, num_classes=10, height=8, width=8, levels=levels)
        return [[lay.class_token(c)] for c in range(10)][:n], lay.num_tokens, "digits"
    raise SystemExit(f"{run}: task {task!r}; this benchmark knows star_graph and digits")


def measure(run: str, drafts: list[int], num_prompts: int, max_new_tokens: int | None, rounds: int,
            lookup: int) -> dict:
    from mutor import MuToRModel
    from mutor.speculative import DraftStats, generate

    model = MuToRModel.from_pretrained(run).eval()
    base = model.base_model
    prompts, task_len, task = _prompts(Path(run), num_prompts)
    new = max_new_tokens or task_len
    methods = ["greedy"] + ([f"prompt_lookup_{lookup}"] if lookup else []) + [f"registers_K{k}" for k in drafts]
    seconds = {m: 0.0 for m in methods}
    tokens = {m: 0 for m in methods}
    stats = {k: DraftStats() for k in drafts}
    kw = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        base.generate(torch.tensor([prompts[0]]), **kw)                            # warm-up
        for r in range(rounds):
            for p in prompts:
                ids = torch.tensor([p])
                ref = None
                for m in (methods if r % 2 == 0 else methods[::-1]):
                    t0 = time.perf_counter()
                    if m == "greedy":
                        out = base.generate(ids, **kw)
                    elif m.startswith("prompt_lookup"):
                        out = base.generate(ids, prompt_lookup_num_tokens=lookup, **kw)
                    else:
                        k = int(m.removeprefix("registers_K"))
                        out, st = generate(model, ids, max_new_tokens=new, draft_registers=k, eos_token_id=[],
                                           prefix_attention="causal")
                        if r == 0:
                            stats[k].add(st)
                    seconds[m] += time.perf_counter() - t0
                    tokens[m] += out.shape[1] - ids.shape[1]
                    if ref is None:
                        ref = out
                    elif not torch.equal(out, ref):
                        raise AssertionError(f"{m} decoded other tokens than {methods[0]} on prompt {p}")
    rows = []
    for m in methods:
        row = {"method": m, "tokens_per_s": round(tokens[m] / seconds[m], 2),
               "speedup_vs_greedy": round(tokens[m] / seconds[m] / (tokens["greedy"] / seconds["greedy"]), 3)}
        if m.startswith("registers_K"):
            row.update(stats[int(m.removeprefix("registers_K"))].to_dict())
        rows.append(row)
    return {"run": run, "task": task, "prompts": len(prompts), "max_new_tokens": new, "rounds": rounds,
            "threads": torch.get_num_threads(), "rows": rows}


def markdown(res: dict) -> str:
    lines = [f"{res['run']} ({res['task']}, {res['prompts']} prompts x {res['max_new_tokens']} new tokens, "
             f"{res['rounds']} rounds, {res['threads']} thread(s))", "",
             "| method | tokens/s | vs greedy | tokens per forward | acceptance per offset |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        acc = ", ".join(f"{d} {a:.2f}" for d, a in r.get("acceptance", {}).items()) or "-"
        tpf = f"{r['tokens_per_forward']:.2f}" if "tokens_per_forward" in r else ("1.00" if r["method"] == "greedy" else "-")
        lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup_vs_greedy']:.2f}x | {tpf} | {acc} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, nargs="+", help="MuToR checkpoint directories (model + sidecar)")
    p.add_argument("--draft", type=int, nargs="+", default=[2, 3, 4], help="K values: drafts for offsets 2..K")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's answer length")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lookup", type=int, default=3, help="prompt_lookup_num_tokens (0: skip)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="append the results as JSON lines to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    for run in args.run:
        res = measure(run, args.draft, args.num_prompts, args.max_new_tokens, args.rounds, args.lookup)
        print(markdown(res), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
