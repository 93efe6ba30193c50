"""Command line: ``mutor <command>``. Thin: each command's parser and runner live in its own module.

A command module exposes ``add_parser(subparsers)`` (which adds one subparser named after the
command) and ``run(args) -> int``. Modules are imported only when needed, so ``mutor --help``
and each command start quickly.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Optional, Sequence

# command -> module with add_parser(sub) and run(args)
COMMANDS = {
    "train": "mutor.train_cli",
    "eval": "mutor.eval_cli",
    "compare": "mutor.eval_cli",
    "sample": "mutor.sample_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mutor", description="MuToR: multi-token prediction with register tokens.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(COMMANDS.values()):      # one module may add several commands
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(None if argv is None else [str(a) for a in argv])
    if extra:   # key=value overrides may follow options: `mutor train R --quiet a.b=1`
        if getattr(args, "overrides", None) is not None and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return importlib.import_module(COMMANDS[args.command]).run(args)


if __name__ == "__main__":
    raise SystemExit(main())
