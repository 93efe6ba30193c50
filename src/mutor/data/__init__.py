"""Datasets and the task registry that ``mutor train`` recipes select with ``data.task``."""

from .registry import TrainingData, build_training_data, register_task, registered_tasks

__all__ = ["TrainingData", "build_training_data", "register_task", "registered_tasks"]
