"""A drafting forward's seconds by its rows, through the model's own head and through the float32 head product.

A drafting round feeds a few rows (the newest token, a draft, registers), and its output layer multiplies them by
the (V, C) weight. The model's head computes ``h @ W^T``; mutor computes a float32 round of up to 8 rows on a CPU
as ``W @ h^T`` (:mod:`mutor.generation.forward`). Both give the same logits up to float rounding; this times them
side by side, every row count through each:

    python -m benchmarks.head_product --model pypi:gemma-3-270m --threads 1 --json-out head_product_gemma.json
    python -m benchmarks.head_product --model pypi:smollm2-135m-instruct --threads 1
    python -m benchmarks.head_product --model RUN_DIR --dtype bfloat16      # any from_pretrained directory

The model gets untrained registers (a forward's cost depends on its rows, not on what they hold). Each round
times every row count 1..``--max-rows`` both ways (:func:`mutor.generation.replay.row_costs`: the median of
``--reps`` forwards after a prompt of ``--prompt-len`` tokens, row counts in a shuffled order), the two heads in
alternating order from round to round; the table gives each median over the rounds and their ratio. Run it with
nothing else loading the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def load(name: str, dtype: str):
    """A MuToR model (d_max=4, untrained registers) around ``name``: a ``pypi:`` model or a directory."""
    from transformers import AutoModelForCausalLM

    from mutor import MuToRConfig, MuToRModel
    from mutor.models.real import converted_model_dir

    path = converted_model_dir(name, quiet=True) if name.startswith("pypi:") else name
    base = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return MuToRModel(base.eval(), MuToRConfig(d_max=4))


def measure(model, max_rows: int, rounds: int, reps: int, prompt_len: int) -> dict:
    """``{"own": {rows: seconds}, "product": {rows: seconds}}``: medians over ``rounds`` of
    :func:`~mutor.generation.replay.row_costs` (key 0: the prompt's forward)."""
    from mutor.generation.replay import row_costs

    prompt = torch.randint(3, min(1000, model.config.vocab_size), (prompt_len,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    runs: dict[str, list[dict[int, float]]] = {"own": [], "product": []}
    for i in range(rounds):
        for head in (("own", "product") if i % 2 == 0 else ("product", "own")):
            runs[head].append(row_costs(model, prompt, max_rows, reps, head=head))
    return {head: {r: statistics.median(c[r] for c in costs) for r in costs[0]} for head, costs in runs.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pypi:gemma-3-270m", help="a pypi: model or a from_pretrained directory")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mutor.generation.forward import head_product

    model = load(args.model, args.dtype)
    costs = measure(model, args.max_rows, args.rounds, args.reps, args.prompt_len)
    product = head_product(model)
    used = "own" if product is None else f"product up to {product.rows} rows, own beyond"
    print(f"{args.model} {args.dtype}, {args.threads} thread(s); drafting uses: {used}")
    print(f"{'rows':>5} {'own ms':>8} {'product ms':>11} {'own/product':>12}")
    rows = []
    for r in sorted(costs["own"]):
        own, prod = costs["own"][r], costs["product"][r]
        rows.append({"rows": r, "own_ms": round(1000 * own, 2), "product_ms": round(1000 * prod, 2),
                     "own_over_product": round(own / prod, 3)})
        print(f"{'prompt' if r == 0 else r:>5} {1000 * own:8.1f} {1000 * prod:11.1f} {own / prod:12.2f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": args.model, "dtype": args.dtype, "threads": args.threads,
                       "prompt_len": args.prompt_len, "rounds": args.rounds, "reps": args.reps,
                       "drafting_uses": used, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
