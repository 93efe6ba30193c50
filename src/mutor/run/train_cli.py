"""``mutor train [RECIPE] [key=value ...] [--resume]``: the logic lives in :mod:`mutor.run.train`."""

from __future__ import annotations

import argparse

from .teardown import end_process, in_process_group, leave_process_group

DEFAULT_RECIPE = "star-graph"


def add_parser(sub) -> None:
    """Add the ``mutor train`` subparser to ``sub``."""
    p = sub.add_parser(
        "train", help="train with a YAML recipe (default: the CPU next-token vs MuToR comparison)",
        description="Train with a recipe: a YAML file or the name of a shipped one (see configs/). Overrides are "
                    "dotted keys: training.max_steps=200 mutor.d_max=6 'method=[next_token,mutor]'. With no "
                    f"recipe, runs '{DEFAULT_RECIPE}', the default CPU comparison.")
    p.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE, help=f"recipe file or name (default {DEFAULT_RECIPE})")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides (values are YAML)")
    p.add_argument("--resume", action="store_true",
                   help="continue each method from its last checkpoint; skip methods that finished")
    p.add_argument("--overwrite", action="store_true",
                   help="clear an existing output directory first (without it, a non-empty one is refused)")
    p.add_argument("--output-dir", default=None, help="shortcut for training.output_dir=...")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    """Run ``mutor train`` on parsed ``args`` (a recipe's methods, one after another); return the exit status."""
    from .train import run_recipe

    overrides = list(args.overrides)
    if "=" in args.recipe:                       # `mutor train key=value`: overrides of the default recipe
        overrides.insert(0, args.recipe)
        args.recipe = DEFAULT_RECIPE
    if args.output_dir:
        overrides.append(f"training.output_dir={args.output_dir}")
    if args.resume and args.overwrite:
        raise SystemExit("mutor train: --resume and --overwrite exclude each other")
    try:
        result = run_recipe(args.recipe, overrides, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite)
    except BaseException:
        leave_process_group(meet=False)          # after an error the other ranks may never meet
        raise
    distributed = in_process_group()
    leave_process_group()
    if not args.quiet:
        print(f"[mutor train] results in {result['output_dir']}")
    if distributed:                              # under torchrun: no teardown of the run's leftovers (teardown.py)
        end_process(0)
    return 0
