"""How much of a MuToR run's update goes to next-token prediction? A gradient probe on a saved checkpoint.

MuToR's loss is ``(1-a)·L_ntp + a·L_reg``, and both terms train the same weights. AdamW normalises the update
per coordinate by the running size of the *whole* gradient, so where the register term's gradient is the
larger one it sets the scale, and the next-token part of the step shrinks; the next-token baseline, with
``L_ntp`` alone, takes the full step at the same learning rate. This measures it on a checkpoint, on
training batches (the run's own data, in dataset order, with offsets sampled as in training):

* ``ntp_grad_norm`` / ``reg_grad_norm``: the norms of the mean gradients of ``(1-a)·L_ntp`` and ``a·L_reg``
  over the model's trainable weights (the ones clipping treats as the model's: LoRA, or every weight in a full
  fine-tune; not the register embedding, which only ``L_reg`` trains), and ``cosine`` between them
  (``batch_cosine``: the mean of the per-batch cosines);
* ``ntp_step_ratio``: the next-token part of MuToR's Adam step, ``mean(g_ntp) / sqrt(mean((g_ntp + g_reg)^2))``,
  against the step next-token training would take at the same weights, ``mean(∇L_ntp) / sqrt(mean(∇L_ntp^2))``,
  the second moments estimated from the probe's batches (Adam's own running estimate, bias-corrected, is what
  these approximate); ``step_along_ntp``: MuToR's whole step projected on that next-token step, in its units.
  1.0: MuToR takes next-token's step; 0.5: half of it.

    python experiments/evidence/grad_share.py /work/runs/evidence/rg-word-reversal/mutor_s0 \
        --checkpoint checkpoint-125 --batches 8 [--append experiments/evidence/grad_share.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

EPS = 1e-8                                              # AdamW's default epsilon


def _sq_norm(ts) -> torch.Tensor:
    return sum(t.double().pow(2).sum() for t in ts)


def gradient_parts(model, batches, seed: int = 0) -> dict:
    """Probe ``model`` (a training wrapper in train mode) on ``batches``: the sums over batches of each part's
    gradient and of the squared gradients that Adam's second moment would see, and the per-batch cosines."""
    params, _ = model.parameter_groups()
    a = model.method_config.loss_weight
    torch.manual_seed(seed)                             # the offsets MuToR samples per sequence
    sums = {k: [torch.zeros_like(p, dtype=torch.float32) for p in params] for k in ("ntp", "reg", "v_mix", "v_ntp")}
    cosines, n = [], 0
    for batch in batches:
        out = model(**batch)
        g_ntp = torch.autograd.grad((1 - a) * out.ntp_loss, params, retain_graph=True, allow_unused=True)
        g_reg = torch.autograd.grad(a * out.reg_loss, params, allow_unused=True)
        g_ntp = [torch.zeros_like(p) if g is None else g.float() for g, p in zip(g_ntp, params)]
        g_reg = [torch.zeros_like(p) if g is None else g.float() for g, p in zip(g_reg, params)]
        for i in range(len(params)):
            sums["ntp"][i] += g_ntp[i]
            sums["reg"][i] += g_reg[i]
            sums["v_mix"][i] += (g_ntp[i] + g_reg[i]).pow(2)    # what MuToR's Adam normalises by
            sums["v_ntp"][i] += (g_ntp[i] / (1 - a)).pow(2)     # what next-token's Adam would
        dot = sum((x.double() * y.double()).sum() for x, y in zip(g_ntp, g_reg))
        denom = (_sq_norm(g_ntp) * _sq_norm(g_reg)).sqrt()
        cosines.append(float(dot / denom) if denom > 0 else float("nan"))
        n += 1
    return {"sums": sums, "batch_cosines": cosines, "batches": n, "loss_weight": a}


def shares(parts: dict) -> dict:
    """The figures of the module docstring from :func:`gradient_parts`' sums."""
    s, n, a = parts["sums"], parts["batches"], parts["loss_weight"]
    g_ntp = [x / n for x in s["ntp"]]
    g_reg = [x / n for x in s["reg"]]
    u_ntp = [g / ((v / n).sqrt() + EPS) for g, v in zip(g_ntp, s["v_mix"])]                # MuToR, next-token part
    u_all = [(g + r) / ((v / n).sqrt() + EPS) for g, r, v in zip(g_ntp, g_reg, s["v_mix"])]  # MuToR, whole step
    u_ref = [g / (1 - a) / ((v / n).sqrt() + EPS) for g, v in zip(g_ntp, s["v_ntp"])]    # next-token training
    ref = float(_sq_norm(u_ref).sqrt())
    along = sum((x.double() * y.double()).sum() for x, y in zip(u_all, u_ref)) / ref
    n_ntp, n_reg = float(_sq_norm(g_ntp).sqrt()), float(_sq_norm(g_reg).sqrt())
    dot = float(sum((x.double() * y.double()).sum() for x, y in zip(g_ntp, g_reg)))
    cos = [c for c in parts["batch_cosines"] if c == c]
    return {"loss_weight": a, "batches": n, "ntp_grad_norm": round(n_ntp, 5), "reg_grad_norm": round(n_reg, 5),
            "cosine": round(dot / (n_ntp * n_reg), 4) if n_ntp and n_reg else None,
            "batch_cosine": round(sum(cos) / len(cos), 4) if cos else None,
            "ntp_step_ratio": round(float(_sq_norm(u_ntp).sqrt()) / ref, 4),
            "step_along_ntp": round(float(along) / ref, 4)}


def training_batches(run: Path, batches: int, micro_batch: int):
    """The run's first ``batches * micro_batch`` training examples, collated as its trainer does."""
    from mutor.data.collator import make_collator
    from mutor.models.real import resolve_model_args
    from mutor.run.recipe import load_recipe
    from mutor.run.train import build_task, build_tokenizer

    r = load_recipe(str(run / "recipe.yaml"))
    r = r.for_method(r.method)
    r.model = resolve_model_args(r.model, lora=bool(r.lora))
    task = build_task(r, build_tokenizer(r.model))
    collate = make_collator(task.pad_token_id, r.data.get("packing", task.packing))
    ds = task.train_dataset
    if len(ds) < batches * micro_batch:
        raise SystemExit(f"{run}: {len(ds)} training examples, fewer than {batches} batches of {micro_batch}")
    return [collate([ds[i] for i in range(b * micro_batch, (b + 1) * micro_batch)]) for b in range(batches)]


def probe(run: Path, checkpoint: str, batches: int, micro_batch: int, seed: int = 0) -> dict:
    from mutor.methods.mutor import MuToRModel

    ckpt = run / checkpoint if checkpoint else run
    if not (ckpt / "mutor_config.json").exists():
        raise SystemExit(f"{ckpt} has no registers (no mutor_config.json): a MuToR checkpoint is needed")
    model = MuToRModel.from_pretrained(str(ckpt), dtype=torch.float32).train()   # a LoRA adapter loads trainable
    row = shares(gradient_parts(model, training_batches(run, batches, micro_batch), seed))
    return {"group": run.parent.name, "run": run.name, "path": str(run), "checkpoint": checkpoint or "final",
            "micro_batch": micro_batch, **row}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a MuToR run directory (its recipe.yaml gives the training data)")
    ap.add_argument("--checkpoint", default="", help="a checkpoint directory inside the run (default: the final model)")
    ap.add_argument("--batches", type=int, default=8, help="training batches to probe")
    ap.add_argument("--micro-batch", type=int, default=4, help="examples per batch")
    ap.add_argument("--seed", type=int, default=0, help="seeds the offsets MuToR samples")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--append", type=Path, default=None, help="also append the row to this JSONL file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    row = json.dumps(probe(args.run, args.checkpoint, args.batches, args.micro_batch, args.seed))
    print(row)
    if args.append is not None:
        with args.append.open("a") as f:
            f.write(row + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
