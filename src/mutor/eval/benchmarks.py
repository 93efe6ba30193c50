"""Evaluation benchmarks, keyed by ``mutor eval --task`` name: a :class:`Benchmark` pairs a prompt/completion
template from :mod:`mutor.data.templates` (so prompts are exactly the training prompts) with a scorer.

The table is the whole interface: :func:`register_benchmark` adds one, :func:`get_benchmark` looks one up.
Generated benchmarks (gsm_symbolic, reasoning_gym) bring their own examples and import reasoning-gym only when
their examples are asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..data.templates import TextTemplate, get_template
from . import metrics

__all__ = ["Benchmark", "BENCHMARKS", "register_benchmark", "get_benchmark"]


@dataclass(frozen=True)
class Benchmark:
    """An evaluation benchmark: its template (prompts, splits, generation budget) and how it is scored,
    ``score(generation, reference) -> dict`` of per-example numbers."""

    template: TextTemplate
    score: Callable[[str, str], dict]
    extract: Callable[[str], Optional[str]]
    primary: str                          # the summary metric that ranks checkpoints
    # generated data (gsm_symbolic): examples(split, limit, model_path) -> rows, instead of the Hub
    examples: Optional[Callable[..., list]] = None
    test_splits: tuple = ("test",)        # what is reported; with several, `mutor eval` scores each
    # a scorer that needs the whole example (reasoning-gym's verifiers): score_example(generation, example)
    score_example: Optional[Callable[[str, dict], dict]] = None


def _verdict(correct: Callable[[str, str], bool]) -> Callable[[str, str], dict]:
    return lambda gen, ref: {"accuracy": 100.0 * float(correct(gen, ref))}


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str, benchmark: Benchmark) -> None:
    BENCHMARKS[name] = benchmark


register_benchmark("gsm8k", Benchmark(get_template("gsm8k"), _verdict(metrics.gsm8k_correct), metrics.extract_gsm8k,
                                      "accuracy"))
register_benchmark("math500", Benchmark(get_template("math500"), _verdict(metrics.math_correct), metrics.last_boxed,
                                        "accuracy"))
register_benchmark("aqua_rat", Benchmark(get_template("aqua_rat"), _verdict(metrics.aqua_correct),
                                         metrics.extract_choice, "accuracy"))
for _name in ("samsum", "dialogsum"):
    register_benchmark(_name, Benchmark(get_template(_name), metrics.rouge_scores, lambda g: None, "rougeL"))


def _gsm_symbolic_examples(split: str, limit: Optional[int], model_path: Optional[str]) -> list[dict]:
    from ..data.gsm_symbolic import gsm_symbolic_examples  # reasoning-gym is imported only when used

    return gsm_symbolic_examples(split, limit, model_path)


def _gsm_symbolic_benchmark() -> Benchmark:
    from ..data.gsm_symbolic import EVAL_SPLITS, GSM_SYMBOLIC

    return Benchmark(GSM_SYMBOLIC, _verdict(metrics.gsm8k_correct), metrics.extract_gsm8k, "accuracy",
                     examples=_gsm_symbolic_examples, test_splits=EVAL_SPLITS)


register_benchmark("gsm_symbolic", _gsm_symbolic_benchmark())


def _reasoning_gym_examples(split: str, limit: Optional[int], model_path: Optional[str]) -> list[dict]:
    from ..data.reasoning_tasks import reasoning_gym_examples

    return reasoning_gym_examples(split, limit, model_path)


def _reasoning_gym_score(generation: str, example: dict) -> dict:
    from ..data.reasoning_tasks import score

    return score(generation, example)


def _reasoning_gym_benchmark() -> Benchmark:
    from ..data.reasoning_tasks import REASONING_GYM

    return Benchmark(REASONING_GYM, lambda g, r: {}, lambda g: g.strip(), "accuracy",
                     examples=_reasoning_gym_examples, score_example=_reasoning_gym_score)


register_benchmark("reasoning_gym", _reasoning_gym_benchmark())


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown eval task {name!r}; known: {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]
