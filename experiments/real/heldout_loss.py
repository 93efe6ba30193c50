"""Held-out answer loss of fine-tuned gsm_symbolic models: a finer measure than exact match at a 135M model's floor.

For each model directory (a run's final model, or the base model itself), the mean next-token
cross-entropy over the answer tokens (chain of thought + eos) of the first ``--limit`` examples of
both held-out splits, with the prompt under the prefix attention the run was trained with (read from
the run, as ``mutor eval`` reads it). The loss goes through :class:`mutor.methods.next_token.NextTokenModel`,
the same mask and loss path as training. The standard error is over examples (each example's mean
token loss is one sample; the reported mean is token-weighted, as training's); each example's loss and
token count are kept, so two models can be compared pairwise on the same examples.

    python experiments/real/heldout_loss.py RUN_DIR [RUN_DIR ...] --limit 100 --output FILE.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def answer_losses(model_dir: str, split: str, limit: int, prefix_attention: str) -> dict:
    from mutor.data.collator import PaddingCollator
    from mutor.data.gsm_symbolic import GSM_SYMBOLIC, gsm_symbolic_examples
    from mutor.data.text import tokenize_pair
    from mutor.eval.harness import load_model_and_tokenizer
    from mutor.methods.next_token import NextTokenConfig, NextTokenModel

    base, tok = load_model_and_tokenizer(model_dir, device="cpu")
    model = NextTokenModel(base, NextTokenConfig(prefix_attention=prefix_attention)).eval()
    rows = gsm_symbolic_examples(split, limit, model_dir)
    encoded = [tokenize_pair(tok, GSM_SYMBOLIC.prompt.format(**r), GSM_SYMBOLIC.completion.format(**r)) for r in rows]
    per_example, tokens = [], []
    collate = PaddingCollator(pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        for ex in encoded:                                 # one example a forward: its own mean and token count
            out = model(**collate([ex]))
            per_example.append(float(out.ntp_loss))
            tokens.append(int(out.num_ntp_tokens))
    n = len(per_example)
    mean_tok = sum(l * t for l, t in zip(per_example, tokens)) / sum(tokens)
    mean_ex = sum(per_example) / n
    sd = math.sqrt(sum((x - mean_ex) ** 2 for x in per_example) / (n - 1)) if n > 1 else float("nan")
    return {"split": split, "n": n, "answer_tokens": sum(tokens), "answer_loss": mean_tok,
            "answer_loss_per_example_mean": mean_ex, "se": sd / math.sqrt(n),
            "per_example": [round(x, 5) for x in per_example], "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--prefix-attention", default=None, help="default: what the run was trained with")
    ap.add_argument("--output", default=None, help="append one JSON line per model and split")
    args = ap.parse_args()
    from mutor.eval.harness import run_info

    for m in args.models:
        info = run_info(m)
        prefix = args.prefix_attention or info.get("prefix_attention", "causal")
        for split in ("test", "test_new_templates"):
            t0 = time.perf_counter()
            res = {"model": m, "method": info.get("method", "base"), "seed": info.get("seed"),
                   "prefix_attention": prefix, **answer_losses(m, split, args.limit, prefix),
                   "seconds": round(time.perf_counter() - t0, 1)}
            print(json.dumps(res), flush=True)
            if args.output:
                with open(args.output, "a") as f:
                    f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
