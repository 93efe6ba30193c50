"""Training rows against the model's positions: refused in one line, or cut with ``data.truncate_to_model``.

The check runs once the tokenizer, the task and the model are built and before anything trains
(:func:`fit_to_model`, called by :mod:`mutor.run.train`). A task's ``max_length`` (``data.max_length``,
or the task's own bound) is the longest row it can give; in a packed batch position ids restart with
each document, so it bounds every position id there too, and MuToR's registers stay within it
(:mod:`mutor.models.positions`). When it exceeds the model's positions the run is refused, naming both
numbers and both keys, even for a rotary model that would run past them: it was not trained there, and
cutting is a choice the recipe states. With ``data.truncate_to_model: true`` every longer row is cut to the
positions (input ids, labels and every other per-token column), a row left without a next-token target is
dropped, and one line says how many.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..core.layout import IGNORE_INDEX
from ..data.registry import TrainingData
from ..models.positions import position_limit
from ..utils.errors import MutorUserError

if TYPE_CHECKING:                                 # annotations only: recipe.py imports this module
    from .recipe import Recipe

__all__ = ["TRUNCATE_KEY", "check_truncate_option", "fit_to_model"]

TRUNCATE_KEY = "truncate_to_model"     # data block key, read by the run (like ``packing``), not by the task


def check_truncate_option(data: dict) -> None:
    """A :class:`MutorUserError` unless ``data.truncate_to_model`` is absent, true or false."""
    value = data.get(TRUNCATE_KEY, False)
    if not isinstance(value, bool):
        raise MutorUserError(f"recipe data.{TRUNCATE_KEY}: must be true or false (got {value!r})")


def fit_to_model(r: Recipe, task: TrainingData, model: Any, say: Callable[[str], Any] = print) -> TrainingData:
    """``task`` as the model can train on it: unchanged when its rows fit in the model's positions; else refused,
    or with ``data.truncate_to_model: true`` its longer rows cut to them (and ``say`` tells how many).

    Args:
        r: The recipe (its ``data`` block: ``max_length``, ``truncate_to_model``).
        task: The built task.
        model: The model to train (a wrapper, a peft model or a plain transformers model: its ``config`` is read).
        say: Where the one-line notice of a cut goes.

    Returns:
        The task, or a copy with the cut datasets, ``max_length`` set to the positions and the counts in ``info``.

    Raises:
        MutorUserError: The rows may exceed the positions and the recipe does not ask to cut them; or it does, but
            the task's examples are not token rows that can be cut, or none would keep a next-token target.
    """
    limit = position_limit(getattr(model, "config", None))
    longest = task.max_length if task.max_length is not None else _longest(task)
    if limit is None or longest is None or longest <= limit[0]:
        return task
    n, field = limit
    what, key = _length_key(r, task, longest)
    if not r.data.get(TRUNCATE_KEY, False):
        fix = f"lower {key} to {n} or less" if key else "use a model with more positions"
        raise MutorUserError(f"{what} exceeds the model's {n} positions ({field} in its config; a model is not "
                             f"trained past them, even one that can run there): {fix}, or set "
                             f"data.{TRUNCATE_KEY}: true to cut longer sequences to {n} tokens")
    return _cut(task, n, field, say)


def _length_key(r: Recipe, task: TrainingData, longest: int) -> tuple[str, Optional[str]]:
    """How the message names the row bound, and the recipe key that sets it (None when no key does)."""
    if "max_length" in r.data:
        return f"data.max_length {longest}", "data.max_length"
    if task.info.get("max_length") == longest:
        return f"data.max_length {longest} (the task's default)", "data.max_length"
    return f"data.task {r.data['task']!r}'s longest sequence ({longest} tokens)", None


def _longest(task: TrainingData) -> Optional[int]:
    """The longest row of the task's datasets, for a task that states no ``max_length`` (None if unknown)."""
    lengths = [max((len(x) for x in ds["input_ids"]), default=0) for ds in (task.train_dataset, task.eval_dataset)
               if _is_token_rows(ds)]
    return max(lengths) if lengths else None


def _is_token_rows(ds: Any) -> bool:
    return ds is not None and {"input_ids", "labels"} <= set(getattr(ds, "column_names", None) or ())


def _cut(task: TrainingData, n: int, field: str, say) -> TrainingData:
    """The task with every row longer than ``n`` tokens cut to ``n``, rows without a target left dropped."""
    if not _is_token_rows(task.train_dataset) or (task.eval_dataset is not None
                                                  and not _is_token_rows(task.eval_dataset)):
        raise MutorUserError(f"data.{TRUNCATE_KEY}: the examples of this task are not token rows that can be cut "
                             f"(it builds its own sequences); use a model with more than {n} positions ({field})")
    train, cut, dropped = _cut_rows(task.train_dataset, n)
    if len(train) == 0:
        raise MutorUserError(f"data.{TRUNCATE_KEY}: cut to the model's {n} positions ({field}), no training example "
                             "keeps a next-token target (the prompts alone are that long); use a model with more "
                             "positions or shorter prompts")
    parts = [f"{cut} of {len(task.train_dataset)} training rows"]
    info = {**task.info, "cut_to_model": cut, "dropped_after_cut": dropped, "model_positions": n}
    eval_ds = task.eval_dataset
    if eval_ds is not None:
        eval_ds, e_cut, e_dropped = _cut_rows(task.eval_dataset, n)
        parts.append(f"{e_cut} of {len(task.eval_dataset)} held-out rows")
        dropped += e_dropped
        info.update(eval_cut_to_model=e_cut, eval_dropped_after_cut=e_dropped)
    say(f"[mutor train] data.{TRUNCATE_KEY}: {' and '.join(parts)} cut to the model's {n} positions ({field})"
        + (f"; {dropped} left without a next-token target dropped" if dropped else ""))
    return dataclasses.replace(task, train_dataset=train, eval_dataset=eval_ds, max_length=n, info=info)


def _cut_rows(ds, n: int):
    """``(dataset, rows cut, rows dropped)``: each per-token column (as long as ``input_ids``) of a longer row cut
    to ``n``; a cut row without a next-token target (a supervised label after its first token) dropped."""
    lengths = [len(x) for x in ds["input_ids"]]
    long = sum(length > n for length in lengths)
    if not long:
        return ds, 0, 0
    first = ds[lengths.index(max(lengths))]
    per_token = [c for c in ds.column_names if isinstance(first[c], list) and len(first[c]) == max(lengths)]

    out = ds.map(lambda ex: {c: ex[c][:n] for c in per_token}, desc="cutting to the model's positions")
    kept = out.filter(lambda ex, i: lengths[i] <= n or any(t != IGNORE_INDEX for t in ex["labels"][1:]),
                      with_indices=True, desc="dropping cut rows without a target")
    return kept, long, len(out) - len(kept)
