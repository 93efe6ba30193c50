"""Evaluation: the paper's protocol for math and summarization (``mutor eval``, ``mutor compare``)."""

from .benchmarks import BENCHMARKS, Benchmark, get_benchmark, register_benchmark
from .harness import evaluate_checkpoints, evaluate_model

__all__ = ["BENCHMARKS", "Benchmark", "evaluate_checkpoints", "evaluate_model", "get_benchmark", "register_benchmark"]
