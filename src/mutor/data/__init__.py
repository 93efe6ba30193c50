"""Datasets and the task registry that ``mutor train`` recipes select with ``data.task``."""

from .registry import TaskData, build_task, register_task, registered_tasks

__all__ = ["TaskData", "build_task", "register_task", "registered_tasks"]
