"""The callbacks :class:`~mutor.integrations.trainer.MuToRTrainer` adds: the task's own evaluator on a
schedule, a log at the last step, and the run's loss sum in every checkpoint.

What is unusual: the task evaluator logs through the trainer while a training log of the same step may be due,
so it restores ``control.should_log`` after its own log; and the loss sum read for a checkpoint lives in two
private attributes of Trainer (listed in :data:`~mutor.integrations.trainer.PRIVATE_TRAINER_NAMES`), so that
:meth:`~mutor.integrations.trainer.MuToRTrainer.whole_run_train_loss` is the mean over the whole run after a
resume too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .training_args import mutor_option

__all__ = ["LogLastStep", "LossSumInCheckpoint", "TRAIN_LOSS_FILE", "TaskEvalCallback", "eval_interval"]

TRAIN_LOSS_FILE = "mutor_train_loss.json"


def eval_interval(eval_steps, max_steps: int) -> Optional[int]:
    """``eval_steps`` in steps, resolved as Trainer resolves it: a value below 1 is a fraction of ``max_steps``
    (``ceil(max_steps * eval_steps)``); None or 0 means no periodic evaluation."""
    if not eval_steps:
        return None
    if eval_steps < 1:
        return max(1, math.ceil(max_steps * eval_steps))
    return int(eval_steps)


class TaskEvalCallback(TrainerCallback):
    """Run the task's evaluator at step 0, every ``task_eval_steps`` (else ``eval_steps``) and at the end."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer                  # a MuToRTrainer: run_task_evaluator, log

    def _run(self, state, control) -> None:
        t = self.trainer
        done = {h["eval_step"] for h in state.log_history if "eval_step" in h}
        if state.global_step in done:
            return
        metrics = t.run_task_evaluator(state.global_step)
        if metrics:
            due = control.should_log            # Trainer.log() clears it; the step's training log must still happen
            t.log({"eval_step": state.global_step, **{f"eval_{k}": v for k, v in metrics.items()}})
            control.should_log = due

    def on_train_begin(self, args, state, control, **kwargs):
        """Evaluate the task on the starting weights (step 0)."""
        self._run(state, control)

    def on_step_end(self, args, state, control, **kwargs):
        """Evaluate the task every ``task_eval_steps`` (else ``eval_steps``) steps and at the last step."""
        steps = mutor_option(args, "task_eval_steps")
        every = eval_interval(args.eval_steps if steps is None else steps, state.max_steps)
        if (every and state.global_step % every == 0) or state.global_step >= state.max_steps:
            self._run(state, control)


class LogLastStep(TrainerCallback):
    """Log at the last step too, so a run shorter than ``logging_steps`` records its training loss."""

    def on_step_end(self, args, state, control, **kwargs):
        """Ask for a log at the last step."""
        if state.global_step >= state.max_steps and args.logging_strategy != "no":
            control.should_log = True


class LossSumInCheckpoint(TrainerCallback):
    """Write the run's training-loss sum so far (what Trainer's ``train_loss`` sums) into each checkpoint."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        """Write the training-loss sum so far into the checkpoint just saved (``TRAIN_LOSS_FILE``)."""
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if args.should_save and folder.is_dir():
            t = self.trainer
            # private: Trainer keeps the sum of the logged windows and the window since in these two, with no
            # public accessor (its train_loss exists only once train() returns)
            loss_sum = t._total_loss_scalar + float(t._tr_loss.item())
            (folder / TRAIN_LOSS_FILE).write_text(json.dumps({"global_step": state.global_step,
                                                              "loss_sum": loss_sum}) + "\n")
