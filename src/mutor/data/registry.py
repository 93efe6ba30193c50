"""The task registry: how a recipe's ``data.task`` name becomes datasets, a vocabulary and an evaluator.

A task is a builder, a function ``build(options: dict, tokenizer, seed: int) -> TrainingData``,
registered under a name with :func:`register_task`. ``options`` is the recipe's ``data``
block minus its run keys (:data:`RUN_KEYS`); a builder must reject options it does not know
(:func:`check_options`). Text tasks use the tokenizer; synthetic tasks (star graphs, image codes) ignore it
and say how big the vocabulary is, and the recipe builds a model of that size from config.

Builders are registered lazily: :func:`build_training_data` imports the module that defines a name
the first time it is asked for, so importing mutor stays cheap.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["TrainingData", "RUN_KEYS", "register_task", "build_training_data", "registered_tasks", "check_options"]

# the data block's keys the run itself reads, for every task (the fields of mutor.run.arguments.DataArguments);
# a builder never sees them, but an unknown key's message lists them with the task's own
RUN_KEYS = ("task", "packing", "truncate_to_model")


@dataclass
class TrainingData:
    """What a task gives the trainer: its built datasets, the model size they need, and its evaluator.

    Datasets yield dicts with ``input_ids`` and ``labels`` (lists of ints, -100 where no loss),
    optionally ``position_ids`` for packed rows. ``evaluator(model, step) -> dict`` computes
    held-out metrics with the plain model (registers play no part); the trainer calls it every
    ``eval_steps`` and puts its numbers in the logs and the run summary.
    """

    train_dataset: Any
    eval_dataset: Any = None
    vocab_size: Optional[int] = None          # tokenizer-less tasks: the size of the model to build
    pad_token_id: int = 0
    eos_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    max_length: Optional[int] = None          # longest row, for max_position_embeddings
    mutor_overrides: dict = field(default_factory=dict)   # e.g. grid_width/grid_start for 2D offsets
    evaluator: Optional[Callable[[Any, int], dict]] = None
    primary_metric: Optional[str] = None      # the evaluator key a comparison table leads with
    primary_higher_is_better: bool = True     # False for distances and losses (FD, bits per token)
    callbacks: list = field(default_factory=list)   # extra TrainerCallbacks the task needs (e.g. epoch-aware data)
    info: dict = field(default_factory=dict)  # counts worth reporting (e.g. examples dropped as too long)
    packing: bool = False                     # the task's default for data.packing (plain text: True)


_BUILDERS: dict[str, Callable[..., TrainingData]] = {}

# name -> module that registers it (imported on first use)
_LAZY = {
    "prompt_completion": "mutor.data.text",
    "chat": "mutor.data.chat",
    "text": "mutor.data.text",
    "gsm8k": "mutor.data.text",
    "omi2_1m_gsm": "mutor.data.text",
    "omi2_2m_gsm": "mutor.data.text",
    "omi2_1m_math": "mutor.data.text",
    "aqua_rat": "mutor.data.text",
    "samsum": "mutor.data.text",
    "dialogsum": "mutor.data.text",
    "gsm_symbolic": "mutor.data.gsm_symbolic",
    "reasoning_gym": "mutor.data.reasoning_tasks",
    "star_graph": "mutor.data.star_graph",
    "digits": "mutor.image.data",
    "image_codes": "mutor.image.data",
}


def register_task(name: str) -> Callable[[Callable[..., TrainingData]], Callable[..., TrainingData]]:
    """Decorator that registers a ``(options, tokenizer, seed) -> TrainingData`` builder as data task ``name``."""
    def deco(fn: Callable[..., TrainingData]) -> Callable[..., TrainingData]:
        _BUILDERS[name] = fn
        return fn

    return deco


def check_options(options: dict, allowed, task: str) -> None:
    """Refuse data options task ``task`` does not take, in one line: the closest known key of each, and every key
    the data block takes (the task's own and :data:`RUN_KEYS`).

    Args:
        options: The data block without its run keys.
        allowed: The task's own options.
        task: The task's name.

    Raises:
        MutorUserError: Naming the unknown keys; the list of known keys is the message's last ``[...]``.
    """
    from ..utils.errors import MutorUserError, did_you_mean

    unknown = sorted((k for k in options if k not in allowed), key=str)
    if unknown:
        known = sorted(set(allowed) | set(RUN_KEYS))
        hint = did_you_mean(unknown, known)
        raise MutorUserError(f"recipe data: unknown key(s) {unknown} for task {task!r} ({hint + '; ' if hint else ''}"
                             f"known: {known})")


def registered_tasks() -> list[str]:
    """The names of every data task, built in or registered, sorted."""
    return sorted(set(_BUILDERS) | set(_LAZY))


def build_training_data(name: str, options: Optional[dict] = None, tokenizer: Any = None,
                        seed: int = 0) -> TrainingData:
    """Build the training (and evaluation) data of task ``name``.

    Args:
        name: A registered data task (see :func:`registered_tasks`).
        options: The task's options (the recipe's ``data`` block).
        tokenizer: The tokenizer text tasks encode with; ``None`` for tasks with their own vocabulary.
        seed: Seed for sampling and shuffling.

    Returns:
        The task's :class:`TrainingData`.

    Raises:
        ValueError: ``name`` is not a known task.
    """
    if name not in _BUILDERS and name in _LAZY:
        importlib.import_module(_LAZY[name])
    if name not in _BUILDERS:
        raise ValueError(f"unknown data.task {name!r}; known tasks: {registered_tasks()}")
    return _BUILDERS[name](dict(options or {}), tokenizer, seed)
