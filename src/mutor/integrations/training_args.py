"""mutor's training options as fields of the training arguments: ``grad_clip`` and ``task_eval_steps``.

:class:`MuToRArguments` is a mixin dataclass: beside ``transformers.TrainingArguments`` it makes
:class:`MuToRTrainingArguments` (what :class:`~mutor.integrations.trainer.MuToRTrainer` takes, and what a
recipe's ``training`` block is read into), beside TRL's ``SFTConfig`` it makes
:class:`~mutor.integrations.trl.MuToRSFTConfig`. What is unusual: its ``__post_init__`` runs the other base's
checks first, and :func:`mutor_option` gives a field's default when the trainer was handed plain arguments
without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from transformers import TrainingArguments

from .clipping import GRAD_CLIP_MODES, check_grad_clip

__all__ = ["MuToRArguments", "MuToRTrainingArguments", "mutor_option"]


@dataclass
class MuToRArguments:
    """mutor's training options, mixed into Trainer's (:class:`MuToRTrainingArguments`) or TRL's
    (:class:`~mutor.integrations.trl.MuToRSFTConfig`) arguments. Each field's ``help`` says what it takes.

    Raises:
        ValueError: An unknown ``grad_clip``, or a negative ``task_eval_steps``.
    """

    grad_clip: str = field(
        default=GRAD_CLIP_MODES[0],
        metadata={"help": "separate | joint: how max_grad_norm treats the method's own parameters (register "
                          "vector, Multi-Token heads). separate: they and the model are clipped each on its own, so "
                          "the model's update is clipped exactly as without them; joint: Trainer's clipping of all "
                          "parameters together (the paper's official code). mutor.integrations.clipping"})
    task_eval_steps: Optional[float] = field(
        default=None,
        metadata={"help": "How often the task's own evaluator runs (the star-graph solve rate, the digits' "
                          "samples), in steps, or a fraction of max_steps when below 1; 0: only at step 0 and at "
                          "the end, where it always runs. None: eval_steps."})

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()                                     # TrainingArguments' (or SFTConfig's) own checks first
        check_grad_clip(self.grad_clip)
        if self.task_eval_steps is not None and not self.task_eval_steps >= 0:
            raise ValueError(f"task_eval_steps must be >= 0 or None (got {self.task_eval_steps!r})")


@dataclass
class MuToRTrainingArguments(MuToRArguments, TrainingArguments):
    """``transformers.TrainingArguments`` with mutor's options (:class:`MuToRArguments`): what
    :class:`~mutor.integrations.trainer.MuToRTrainer` takes as ``args``, and what a recipe's ``training`` block
    is read into. A plain ``TrainingArguments`` works too, with mutor's defaults."""


_DEFAULTS = {f.name: f.default for f in fields(MuToRArguments)}


def mutor_option(args, name: str):
    """A :class:`MuToRArguments` field of ``args``, or its default for a plain ``TrainingArguments`` /
    ``SFTConfig``."""
    return getattr(args, name, _DEFAULTS[name])
