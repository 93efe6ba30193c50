"""User errors: one exception type for bad input, and the "did you mean" hint its messages carry.

What is unusual: :class:`MutorUserError` is a ``ValueError``, so code that already catches ``ValueError``
keeps working, and the command line (:mod:`mutor.run.cli`) prints any of them as one line on stderr with
exit status 2 instead of a traceback (``MUTOR_DEBUG=1`` or ``--debug`` keeps the traceback). Loading a
model or tokenizer with such one-line failures is :func:`mutor.models.loading.from_pretrained`.
"""

from __future__ import annotations

__all__ = ["MutorUserError", "did_you_mean"]


class MutorUserError(ValueError):
    """Bad input from the user (a recipe, a path, a flag): the message names the problem and what was expected."""


def did_you_mean(unknown: list[str], known: list[str]) -> str:
    """``'x': did you mean 'y'?`` for each of ``unknown`` close to one of ``known`` ('' when none is)."""
    import difflib

    close = {k: difflib.get_close_matches(str(k), [str(x) for x in known], n=1) for k in unknown}
    return "; ".join(f"{k!r}: did you mean {c[0]!r}?" for k, c in close.items() if c)
