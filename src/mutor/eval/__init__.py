"""Evaluation: the paper's protocol for math and summarization (``mutor eval``, ``mutor compare``)."""

from .harness import EVAL_TASKS, EvalTask, evaluate_checkpoints, evaluate_model, register_eval_task

__all__ = ["EVAL_TASKS", "EvalTask", "evaluate_checkpoints", "evaluate_model", "register_eval_task"]
