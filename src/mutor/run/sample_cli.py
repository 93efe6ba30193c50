"""``mutor sample``: images from a model trained on an image task; the logic lives in :mod:`mutor.image`."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path


def add_parser(sub) -> None:
    """Add the ``mutor sample`` subparser to ``sub``."""
    from ..models.loading import DTYPES

    p = sub.add_parser("sample", help="sample class-conditional images (KV cache, CFG, temperature, top-k)",
                       description="Sample images from a model trained with an image task (digits, image_codes). "
                                   "Writes codes.npy, labels.npy and, for digits, one PNG grid per class.")
    p.add_argument("--model", required=True, help="a run or checkpoint directory of an image task")
    p.add_argument("--num-per-class", type=int, default=10, help="images per class (default 10)")
    p.add_argument("--classes", type=int, nargs="*", default=None, help="default: every class")
    p.add_argument("--cfg-scale", type=float, default=2.0, help="classifier-free guidance scale (1: none)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="softmax temperature of the sampled codes (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest codes only (default: all)")
    p.add_argument("--batch-size", type=int, default=256, help="images sampled together (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (default 0)")
    p.add_argument("--device", default=None, help="torch device to sample on (default: cuda when a GPU is visible, "
                                                 "else cpu)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="dtype to load the model in (default: the "
                                                                   "checkpoint's own)")
    p.add_argument("--output-dir", default=None, help="default: <model>/samples")
    p.set_defaults(command="sample")


def _layout(model_dir: Path):
    from ..image.tokens import ImageLayout
    from ..utils.io import run_json_files

    for info in run_json_files(model_dir, "task_info.json"):
        if "image_layout" in info:
            return ImageLayout(**info["image_layout"])
    raise SystemExit(f"mutor sample: no task_info.json with an image layout in {model_dir} or its parent; "
                     "is this a run of an image task (digits, image_codes)?")


@contextlib.contextmanager
def _token_progress(model, n_images: int, batch_size: int, num_tokens: int):
    """A progress bar (stderr) over the sampling forwards: one per generated token of each batch, counted
    by a forward hook, so nothing in the sampler changes."""
    from tqdm.auto import tqdm

    n_batches = -(-n_images // max(batch_size, 1))
    bar = tqdm(total=n_batches * num_tokens, desc=f"sampling {n_images} images", unit="tok")

    def count(*_) -> None:                     # a hook that returned a value would replace the output
        bar.update(1)

    hook = model.register_forward_hook(count)
    try:
        yield bar
    finally:
        hook.remove()
        bar.close()


def run(args: argparse.Namespace) -> int:
    """Run ``mutor sample`` on parsed ``args``: sample images from the model and save them; return the exit status."""
    import numpy as np
    import torch

    from ..image.rotary2d import apply_saved_rotary_2d
    from ..image.sample import sample_codes, save_grid_png
    from ..models.loading import from_pretrained, load_causal_lm

    model_dir = Path(args.model)
    layout = _layout(model_dir)
    classes = args.classes if args.classes else list(range(layout.num_classes))
    if any(not 0 <= c < layout.num_classes for c in classes) or args.num_per_class < 1:
        raise SystemExit(f"mutor sample: classes must lie in [0, {layout.num_classes}) and --num-per-class >= 1")
    try:
        model = from_pretrained(lambda name, **kw: load_causal_lm(name, args.device, args.dtype), str(model_dir),
                                "--model")
    except ValueError as err:
        raise SystemExit(f"mutor sample: {err}") from None
    apply_saved_rotary_2d(model, model_dir)
    wanted = [c for c in classes for _ in range(args.num_per_class)]
    try:
        with _token_progress(model, len(wanted), args.batch_size, layout.num_tokens):
            codes = sample_codes(model, layout, wanted, cfg_scale=args.cfg_scale, temperature=args.temperature,
                                 top_k=args.top_k, generator=torch.Generator().manual_seed(args.seed),
                                 batch_size=args.batch_size)
    except ValueError as err:
        raise SystemExit(f"mutor sample: {err}") from None
    out = Path(args.output_dir or model_dir / "samples")
    from ..utils.io import atomic_write

    atomic_write(out / "codes.npy", lambda tmp: np.save(open(tmp, "wb"), codes))
    atomic_write(out / "labels.npy", lambda tmp: np.save(open(tmp, "wb"), np.asarray(wanted)))
    if layout.levels is not None:
        for c in classes:
            rows = codes[np.asarray(wanted) == c]
            save_grid_png(rows, layout, out / f"class_{c}.png", ncols=min(10, len(rows)),
                          title=f"class {c}, cfg {args.cfg_scale:g}, T={args.temperature:g}")
    print(f"[mutor sample] {len(codes)} samples of {layout.height}x{layout.width} codes in {out}")
    return 0
