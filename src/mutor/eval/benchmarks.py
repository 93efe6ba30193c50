"""Evaluation benchmarks, keyed by ``mutor eval --task`` name: a :class:`Benchmark` pairs a prompt/completion
template from :mod:`mutor.data.templates` (so prompts are exactly the training prompts) with a scorer.

The table is the whole interface: :func:`register_benchmark` adds one, :func:`get_benchmark` looks one up.
Generated benchmarks (gsm_symbolic, reasoning_gym) bring their own examples and import reasoning-gym only when
their examples are asked for.

Your own data (``prompt_completion``, ``chat``) is a benchmark defined by the run it scores: its templates and
files are the ones the run's ``recipe.yaml`` names (:func:`benchmark_for` resolves them), scored by exact match
after whitespace normalisation, or by the user's function (``--scorer module:function``, :func:`load_scorer`):
``fn(prediction: str, reference: str, row: dict) -> float | bool | dict``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..data.templates import TextTemplate, get_template, reference_answer, render_completion, render_prompt
from ..utils.errors import MutorUserError
from . import metrics

__all__ = ["Benchmark", "BENCHMARKS", "benchmark_for", "get_benchmark", "load_scorer", "register_benchmark"]


@dataclass(frozen=True)
class Benchmark:
    """An evaluation benchmark: its template (prompts, splits, generation budget) and how it is scored,
    ``score(generation, reference) -> dict`` of per-example numbers."""

    template: TextTemplate
    score: Callable[[str, str], dict]
    extract: Callable[[str], Optional[str]]
    primary: str                          # the summary metric that ranks checkpoints ("": the first one scored)
    # generated data (gsm_symbolic): examples(split, limit, model_path) -> rows, instead of the Hub
    examples: Optional[Callable[..., list]] = None
    test_splits: tuple = ("test",)        # what is reported; with several, `mutor eval` scores each
    # a scorer that needs the whole example (reasoning-gym's verifiers): score_example(generation, example)
    score_example: Optional[Callable[[str, dict], dict]] = None
    # own data: for_run(model_path) -> this benchmark for the run being scored (its recipe's templates and files)
    for_run: Optional[Callable[[Optional[str]], "Benchmark"]] = None
    # own data: rows(split, data, limit, what) -> checked rows of --data (named `what`) or of the run's files
    rows: Optional[Callable[..., list]] = None
    sources: dict = field(default_factory=dict)   # split -> where its rows come from without --data (for summaries)
    note: Optional[str] = None            # said in every summary (e.g. scored on the training rows)
    prompt_of: Optional[Callable[[dict, Any], str]] = None   # (example, tokenizer) -> prompt; default: the template
    reference_of: Optional[Callable[[dict], str]] = None     # example -> reference; default: the answer field
    add_special_tokens: bool = True       # False where the prompt holds them already (a chat template's)
    budget_from_references: bool = False  # default max_new_tokens: twice the longest reference's tokens
    scorer: Optional[str] = None          # the user's `module:function` that scores it (named in its errors)

    def prompt(self, example: dict, tokenizer=None) -> str:
        """The prompt text of ``example``, exactly as training rendered it."""
        return self.prompt_of(example, tokenizer) if self.prompt_of else render_prompt(self.template, example)

    def reference(self, example: dict) -> str:
        """What the generation of ``example`` is scored against."""
        return self.reference_of(example) if self.reference_of else reference_answer(self.template, example)

    def score_row(self, generation: str, reference: str, example: dict) -> dict:
        """The per-example metrics of one generation."""
        if self.score_example is not None:
            return self.score_example(generation, example)
        return self.score(generation, reference)


def _verdict(correct: Callable[[str, str], bool], name: str = "accuracy") -> Callable[[str, str], dict]:
    return lambda gen, ref: {name: 100.0 * float(correct(gen, ref))}


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str, benchmark: Benchmark) -> None:
    """Make ``benchmark`` available as ``mutor eval --task name`` (replacing one of that name)."""
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
    """The registered benchmark ``name``; raise ``ValueError`` naming the known ones if there is none."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown eval task {name!r}; known: {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def benchmark_for(name: str, model_path: Optional[str] = None, scorer: Optional[str] = None) -> Benchmark:
    """The benchmark ``mutor eval --task name`` scores ``model_path`` with.

    Args:
        name: A registered benchmark.
        model_path: The model directory, checkpoint or run directory being scored: own-data benchmarks read its
            run's ``recipe.yaml``.
        scorer: ``module:function`` (or ``path/to/file.py:function``) replacing the benchmark's metric
            (:func:`load_scorer`).

    Returns:
        The benchmark, resolved for the run and with the scorer in place.

    Raises:
        ValueError: An unknown benchmark; MutorUserError: a scorer that cannot be loaded, a run of another task.
    """
    benchmark = get_benchmark(name)
    if benchmark.for_run is not None:
        benchmark = benchmark.for_run(model_path)
    if scorer is not None:
        benchmark = _with_scorer(benchmark, scorer)
    return benchmark


# ------------------------------------------------------------------------------------------------ own data
def _task_flag(task: Optional[str]) -> str:
    if task in BENCHMARKS:
        return f"use --task {task}"
    if task == "text":
        return "plain-text runs have no completions to score"
    return "use --task run (a synthetic task)"


def _own_data_benchmark(task: str) -> Callable[[Optional[str]], Benchmark]:
    """``for_run`` of ``prompt_completion`` and ``chat``: the run's templates and files, from its recipe."""

    def for_run(model_path: Optional[str]) -> Benchmark:
        from ..data.text import find_run_recipe, resolve_data_path

        found = find_run_recipe(model_path)
        recipe_file, recipe = found if found is not None else (None, {})
        opts = dict(recipe.get("data") or {})
        if found is not None and opts.get("task") != task:
            raise MutorUserError(f"{model_path} is a run of data.task {opts.get('task')!r} (its {recipe_file}), not "
                                 f"of {task!r}: {_task_flag(opts.get('task'))}")
        path = resolve_data_path(opts.get("path"), recipe.get("source_dir"))
        eval_path = resolve_data_path(opts.get("eval_path"), recipe.get("source_dir"))
        hub = opts.get("hub_id")
        sources: dict = {}                 # split -> (local file or None, Hub split, how the error names it)
        if eval_path is not None or opts.get("eval_split") is not None:
            held_out = (eval_path, opts.get("eval_split"),
                        f"data.eval_path of {recipe_file}" if eval_path else f"data.eval_split of {recipe_file}")
            sources = {"test": held_out, "validation": held_out}
        elif path is not None or hub is not None:
            sources = {"test": (path, opts.get("split", "train"), f"data.path of {recipe_file}")}
        note = None
        if "validation" not in sources and "test" in sources:
            note = ("scored on the run's training rows (its recipe names no data.eval_path): give --data FILE to "
                    "score held-out rows")
        if task == "chat":
            from ..data.chat import chat_prompt, check_conversations, need_chat_template

            msg_field = opts.get("messages_field", "messages")
            template = TextTemplate(name="chat", hub_id=hub, hub_config=opts.get("hub_config"), prompt="",
                                    completion="", answer_field=msg_field, selection="validation",
                                    splits={"test": "test", "validation": "validation" if "validation" in sources
                                            else None})

            def prompt_of(ex: dict, tok) -> str:
                need_chat_template(tok)
                return chat_prompt(tok, ex[msg_field])[0]

            def reference_of(ex: dict) -> str:
                return [m for m in ex[msg_field] if m.get("role") == "assistant"][-1]["content"]

            def check(rows, file, what):
                check_conversations(rows, msg_field, file, what)

            extra = dict(prompt_of=prompt_of, reference_of=reference_of, add_special_tokens=False)
        else:
            from ..data.text import check_rows, prompt_completion_template

            template = dataclasses.replace(prompt_completion_template(opts), selection="validation",
                                           splits={"test": "test", "validation": "validation" if "validation" in
                                                   sources else None})

            def check(rows, file, what):
                check_rows(template, rows, file, what)

            extra = dict(reference_of=lambda ex: render_completion(template, ex))

        def rows(split: str, data: Optional[str], limit: Optional[int], what: str = "--data") -> list[dict]:
            from ..data.text import load_rows

            if data is not None:
                file, hub_split = data, None
            elif split in sources:
                file, hub_split, what = sources[split]
            else:
                flag = "--val-data" if split == "validation" else "--data"
                where = f"the run's recipe ({recipe_file})" if recipe_file else f"{model_path} (no run recipe.yaml)"
                raise MutorUserError(f"{where} names no rows to score for the {split} split: give {flag} FILE")
            try:
                loaded = load_rows(file, hub if file is None else None, opts.get("hub_config"), hub_split, what=what)
            except FileNotFoundError as err:
                if data is not None:
                    raise
                raise MutorUserError(f"{err} (from the working directory, nor from {recipe.get('source_dir')}, "
                                     "where the run's recipe was): give --data FILE") from None
            check(loaded, file, what)
            if limit is not None:
                loaded = loaded.select(range(min(int(limit), len(loaded))))
            return [dict(r) for r in loaded]

        described = {s: src[0] or f"{hub}:{src[1]}" for s, src in sources.items()}
        return dataclasses.replace(BENCHMARKS[task], template=template, rows=rows, sources=described, note=note,
                                   for_run=None, **extra)

    return for_run


_PLACEHOLDER = TextTemplate(name="own data", hub_id=None, prompt="{prompt}", completion="{completion}",
                            answer_field="completion")
for _task in ("prompt_completion", "chat"):
    register_benchmark(_task, Benchmark(_PLACEHOLDER, _verdict(metrics.exact_match, "exact_match"),
                                        metrics.normalize_whitespace, "exact_match", for_run=_own_data_benchmark(_task),
                                        budget_from_references=True))


# ------------------------------------------------------------------------------------------ user's scorers
def load_scorer(spec: str) -> Callable[[str, str, dict], Any]:
    """The user's metric named ``module:function`` (a module importable from the working directory or
    ``PYTHONPATH``) or ``path/to/file.py:function``.

    The function is called once per example as ``fn(prediction, reference, row)``: the decoded generation, the
    reference (the rendered completion; a chat row's last assistant turn) and the data row as a dict. It returns
    a number, a bool (counted as 100 or 0, a percentage like ``exact_match``) or a dict of them (one metric per
    key, the first one ranking checkpoints); a scalar is reported under the function's name. The summary's
    metrics are the means over the examples.

    Args:
        spec: ``module:function`` or ``file.py:function``.

    Returns:
        The function.

    Raises:
        MutorUserError: A malformed spec, a module that cannot be imported, no such function, or one that does not
            take three arguments; naming ``spec``.
    """
    import importlib
    import importlib.util
    import inspect
    import os
    import sys

    module_name, _, fn_name = spec.rpartition(":")
    if not module_name or not fn_name.isidentifier():
        raise MutorUserError(f"--scorer {spec!r}: write it as module:function (e.g. my_metrics:score), or "
                             "path/to/file.py:function")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise FileNotFoundError(f"no file {module_name}")
            loader = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            added = os.getcwd() not in sys.path          # the working directory, as `python -m` would have it
            if added:
                sys.path.insert(0, os.getcwd())
            try:
                module = importlib.import_module(module_name)
            finally:
                if added:
                    sys.path.remove(os.getcwd())
    except Exception as err:
        where = "" if module_name.endswith(".py") else ("; the module must be importable from the working directory "
                                                         "or PYTHONPATH")
        raise MutorUserError(f"--scorer {spec!r}: cannot import {module_name} ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}){where}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        have = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise MutorUserError(f"--scorer {spec!r}: {module_name} has no function {fn_name!r} (it has {have})")
    try:
        inspect.signature(fn).bind("prediction", "reference", {})
    except TypeError:
        raise MutorUserError(f"--scorer {spec!r}: {fn_name} must take (prediction, reference, row)") from None
    except ValueError:                    # a builtin without a signature: called as it is
        pass
    return fn


def _metric_value(value: Any) -> Optional[float]:
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return 100.0 * bool(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def _with_scorer(benchmark: Benchmark, spec: str) -> Benchmark:
    """``benchmark`` scored by the user's function (:func:`load_scorer`)."""
    fn = load_scorer(spec)
    name = getattr(fn, "__name__", "score")

    def score_example(generation: str, example: dict) -> dict:
        value = fn(generation, benchmark.reference(example), example)
        items = value.items() if isinstance(value, dict) else [(name, value)]
        out = {str(k): _metric_value(v) for k, v in items}
        if not out or any(v is None for v in out.values()):
            raise TypeError(f"returned {value!r:.80} ({type(value).__name__}); return a number, a bool or a "
                            "non-empty dict of them")
        return out

    return dataclasses.replace(benchmark, score_example=score_example, primary="", scorer=spec)
