"""Any reasoning-gym task as a prompt/completion task, scored by the task's own verifier.

reasoning-gym (``pip install -e ".[reasoning-gym]"``) generates procedural reasoning problems (sorting, reversing,
search, puzzles) with a scorer per task (``dataset.score_answer(answer, entry)``). ``data.task:
reasoning_gym`` with ``data.dataset: <name>`` (and ``data.config``, the task's own generator options)
trains on its items rendered as ``"Question: {question}\\n\\nAnswer:"`` + ``" {answer}"`` + eos (the loss
and MuToR's registers on the answer only); ``mutor eval --task reasoning_gym`` decodes greedily and
scores each answer with the task's verifier: ``accuracy`` is the share it scores 1.0 (exact), ``score``
its mean (some tasks give partial credit).

What is unusual: the data is a pure function of ``(dataset, config, data_seed)``. Each split is its own
reasoning-gym dataset with a seed derived from ``data_seed`` and the split (a million apart: reasoning-gym
seeds item ``i`` with ``seed + i``, so nearby seeds would give shifted copies of one another); ``test`` is drawn first,
then ``validation`` without its questions, then ``train`` without either (small problem spaces repeat
items), so no evaluated question is trained on. ``mutor eval`` rebuilds the splits from the run's
``recipe.yaml``, exactly as training drew them.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

from ..utils.errors import MutorUserError
from .registry import TrainingData, check_options, register_task
from .templates import TextTemplate

__all__ = ["REASONING_GYM", "make_splits", "reasoning_gym_examples", "score"]

REASONING_GYM = TextTemplate(
    name="reasoning_gym", hub_id="reasoning-gym (generated in process)",
    prompt="Question: {question}\n\nAnswer:", completion=" {answer}", answer_field="answer",
    splits={"train": "train", "validation": "validation", "test": "test"}, max_length=512, max_new_tokens=128,
    selection="validation",
    notes="reasoning-gym procedural tasks (data.dataset); scored by the task's own verifier; checkpoints are "
          "picked on validation.")

DEFAULTS = {"dataset": None, "config": {}, "num_train": 2000, "num_validation": 100, "num_test": 300,
            "data_seed": 0, "max_length": 512}
_OPTIONS = set(DEFAULTS) | {"num_proc"}
# reasoning-gym draws item i of a dataset from Random(seed + i): splits seeded 1, 2, 3 would share almost
# every item. Each split gets its own range of a million seeds.
_SPLIT_SEED = {"test": 1_000_000, "validation": 2_000_000, "train": 3_000_000}


def _check(options: dict) -> dict:
    check_options(options, _OPTIONS, "reasoning_gym")
    o = {**DEFAULTS, **options}
    if importlib.util.find_spec("reasoning_gym") is None:
        raise MutorUserError('task reasoning_gym needs reasoning-gym: pip install -e ".[reasoning-gym]" in the mutor '
                             "checkout (or pip install reasoning-gym)")
    from reasoning_gym.factory import DATASETS

    if o["dataset"] not in DATASETS:
        from ..utils.errors import did_you_mean

        raise MutorUserError(f"data.dataset {o['dataset']!r} is not a reasoning-gym task"
                             f"{did_you_mean([str(o['dataset'])], sorted(DATASETS))}; e.g. spell_backward, "
                             "word_sorting, shortest_path")
    if not isinstance(o["config"], dict):
        raise MutorUserError(f"data.config must be a mapping of {o['dataset']}'s generator options "
                             f"(got {o['config']!r})")
    for k in ("num_train", "num_validation", "num_test", "data_seed", "max_length"):
        if not isinstance(o[k], int) or isinstance(o[k], bool) or o[k] < 0:
            raise MutorUserError(f"data.{k} must be an integer >= 0 (got {o[k]!r})")
    return o


def _dataset(o: dict, split: str, size: int):
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(o["dataset"], seed=10_000_000 * o["data_seed"] + _SPLIT_SEED[split],
                                            size=size, **o["config"])
    except (TypeError, ValueError, AssertionError) as err:
        raise MutorUserError(f"reasoning-gym {o['dataset']} refuses data.config {o['config']!r}: {err}") from None


def _draw(o: dict, split: str, n: int, exclude: set) -> list[dict]:
    """``n`` items of ``split`` whose questions are distinct and not in ``exclude``."""
    if n == 0:
        return []
    size = 2 * n + 50
    ds = _dataset(o, split, size)
    rows, seen = [], set(exclude)
    for i in range(size):
        try:
            entry = ds[i]
        except (RuntimeError, ValueError, IndexError, AssertionError):   # generators that fail on some seeds
            continue                                                       # (maze: no free goal cell) skip them
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        rows.append({"question": entry["question"], "answer": str(entry["answer"]), "entry": entry, "index": i})
        if len(rows) == n:
            return rows
    raise MutorUserError(f"reasoning-gym {o['dataset']}: only {len(rows)} distinct {split} items in {size} draws "
                         f"(asked for {n}); its problem space is too small for these sizes")


def make_splits(options: dict) -> dict[str, list[dict]]:
    """``test``, then ``validation`` without test questions, then ``train`` without either."""
    o = _check(options)
    test = _draw(o, "test", o["num_test"], set())
    val = _draw(o, "validation", o["num_validation"], {r["question"] for r in test})
    train = _draw(o, "train", o["num_train"], {r["question"] for r in test + val})
    return {"train": train, "validation": val, "test": test}


def reasoning_gym_examples(split: str, limit: Optional[int] = None, model_path: Optional[str] = None) -> list[dict]:
    """Evaluation rows of ``split`` for ``mutor eval``: the splits of the run ``model_path`` came from."""
    from .text import run_data_block

    data = run_data_block(model_path, "reasoning_gym")
    if not data:
        raise MutorUserError(f"mutor eval --task reasoning_gym scores the reasoning-gym task a run was trained on; "
                             f"{model_path} is not (or is not inside) a run with data.task: reasoning_gym")
    if split not in ("validation", "test"):
        raise MutorUserError(f"reasoning_gym evaluates on validation or test (got {split!r})")
    o = {k: v for k, v in data.items() if k in _OPTIONS - {"num_proc"}}
    rows = make_splits({**o, "num_train": 0})[split]
    return rows if limit is None else rows[:int(limit)]


def score(generation: str, example: dict) -> dict:
    """The task's own verifier on the generated answer (stripped): ``accuracy`` (exact, 0/100), ``score``."""
    from reasoning_gym.factory import get_score_answer_fn

    entry = example["entry"]
    value = float(get_score_answer_fn(entry["metadata"]["source_dataset"])(generation.strip(), entry))
    return {"accuracy": 100.0 * (value >= 1.0), "score": 100.0 * value}


@register_task("reasoning_gym")
def build_reasoning_gym(options: dict, tokenizer: Any, seed: int) -> TrainingData:
    """Options: ``dataset`` (a reasoning-gym task name), ``config`` (its generator options), ``num_train``
    (2000), ``num_validation`` (100; eval loss and checkpoint selection), ``num_test`` (300), ``data_seed``
    (0; not the run's seed), ``max_length`` (512; longer examples are dropped), ``num_proc``."""
    from .text import encode_pairs, need_tokenizer, pad_id_of

    o = _check(options)
    need_tokenizer(tokenizer, "reasoning_gym")
    if o["num_train"] < 1:
        raise MutorUserError(f"data.num_train must be >= 1 (got {o['num_train']})")
    splits = make_splits(o)
    train, dropped = encode_pairs(splits["train"], REASONING_GYM, tokenizer, o["max_length"], o.get("num_proc"))
    if len(train) == 0:
        raise MutorUserError(f"reasoning_gym {o['dataset']}: all {o['num_train']} training examples are longer than "
                             f"max_length={o['max_length']} tokens; raise data.max_length")
    eval_ds = encode_pairs(splits["validation"], REASONING_GYM, tokenizer, o["max_length"])[0] \
        if splits["validation"] else None
    info = {"num_examples": len(train), "dropped_too_long": dropped, "max_length": o["max_length"],
            "dataset": o["dataset"], "config": o["config"], "eval_examples": len(eval_ds) if eval_ds else 0,
            "num_test": o["num_test"], "data_seed": o["data_seed"]}
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=o["max_length"], info=info)
