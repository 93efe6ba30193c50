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
    "demo": "mutor.demo_cli",
    "train": "mutor.train_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mutor", description="MuToR: multi-token prediction with register tokens.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(None if argv is None else [str(a) for a in argv])
    return importlib.import_module(COMMANDS[args.command]).run(args)


if __name__ == "__main__":
    raise SystemExit(main())
