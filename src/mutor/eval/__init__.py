"""Evaluation: the paper's protocol for math and summarization (``mutor eval``, ``mutor compare``)."""

from .harness import BENCHMARKS, Benchmark, evaluate_checkpoints, evaluate_model, get_benchmark, register_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "evaluate_checkpoints", "evaluate_model", "get_benchmark", "register_benchmark"]
