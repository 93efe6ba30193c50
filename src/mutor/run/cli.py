"""Command line: ``mutor <command>``. Thin: each command's parser and runner live in its own module.

A command module exposes ``add_parser(subparsers)`` (which adds one subparser named after the
command) and ``run(args) -> int``. Modules are imported only when needed, so ``mutor --help``
and each command start quickly.

User errors (:class:`~mutor.utils.errors.MutorUserError`, any ``ValueError`` or ``FileNotFoundError``,
a ``SystemExit`` with a message) end as one line on stderr, ``mutor <command>: <problem>``, and
exit status 2; any other exception is a bug and keeps its traceback. ``mutor --debug ...`` or
``MUTOR_DEBUG=1`` keeps the traceback of user errors too. Ctrl-C ends as one line too (exit status 130):
``mutor train`` names the last complete checkpoint and says to ``--resume``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

# command -> module with add_parser(sub) and run(args)
COMMANDS = {
    "train": "mutor.run.train_cli",
    "eval": "mutor.run.eval_cli",
    "compare": "mutor.run.eval_cli",
    "sample": "mutor.run.sample_cli",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``mutor`` argument parser, with a subparser per command."""
    from importlib.metadata import version

    parser = argparse.ArgumentParser(prog="mutor", description="MuToR: multi-token prediction with register tokens.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('mutor')}",
                        help="print mutor's version and exit")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of user errors too (also MUTOR_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(COMMANDS.values()):      # one module may add several commands
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``mutor`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status (2 on a user error)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(None if argv is None else [str(a) for a in argv])
    if extra:   # key=value overrides may follow options: `mutor train R --quiet a.b=1`
        if getattr(args, "overrides", None) is not None and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = args.debug or os.environ.get("MUTOR_DEBUG", "") not in ("", "0")
    try:
        return importlib.import_module(COMMANDS[args.command]).run(args)
    except SystemExit as err:
        if debug or not isinstance(err.code, str):
            raise
        message = err.code
    except (ValueError, FileNotFoundError) as err:     # MutorUserError is a ValueError
        if debug:
            raise
        message = str(err)
    except KeyboardInterrupt as err:                   # Ctrl-C: one line (mutor train says how to resume)
        if debug:
            raise
        _close_progress_bars()
        print(f"mutor {args.command}: {str(err) or 'interrupted'}", file=sys.stderr, flush=True)
        return 130
    prefix = f"mutor {args.command}: "
    message = " ".join(message.split("\n"))
    print(message if message.startswith(prefix) else prefix + message, file=sys.stderr)
    return 2


def _close_progress_bars() -> None:
    """Close the progress bars an interrupted command left open (the Trainer's, ``mutor eval``'s: tqdm), so
    that each ends its own line before the Ctrl-C message and none is redrawn after it at exit."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return
    for bar in list(getattr(std.tqdm, "_instances", ())):
        try:
            bar.close()
        except Exception:      # a bar half torn down by the interrupt: it cannot be redrawn either
            pass


if __name__ == "__main__":
    raise SystemExit(main())
