"""GSM-Symbolic word problems from reasoning-gym, in the paper's GSM8K template: real data, generated here.

reasoning-gym (``pip install -e ".[reasoning-gym]"`` in the mutor checkout)
ships the GSM-Symbolic templates as Python
generators: each template (a GSM8K problem with its numbers and names made variables) draws a
new instance from a ``random.Random`` and returns the question, its chain of thought (GSM8K
style, ending ``#### <number>``; checked for every template in the tests) and the answer.
Nothing is downloaded and every instance is a pure function of its seed string.

Rendering is the paper's GSM8K template (appendix A), the same :data:`GSM_SYMBOLIC` text template
for training and evaluation: prompt ``"Question: {question}\\n\\nAnswer:"``, completion
``" {answer}"`` (the chain of thought) followed by eos, the loss on the completion only, and
exact match on the final number with the GSM8K metric (:func:`mutor.eval.metrics.gsm8k_correct`).
reasoning-gym appends an instruction for chat models to every question ("Give the result as
your final answer. Do not include units."); it is removed, so prompts read like GSM8K.

Splits (what is unusual here): the templates that reasoning-gym marks as correct
(``tasks_ok``, 85 of 100) are divided by a fixed rule, template id ``% heldout_every == 0``
held out (17 templates with the default 5). Training, ``validation`` and ``test`` draw new
instances of the other 68 templates, round-robin over them; ``test_new_templates`` draws
instances of the held-out templates only, which training never sees. ``test`` and
``validation`` are drawn first and training skips any question that appears in them (a few
templates can repeat an instance), so no test question is trained on. Seeds are strings
(``"gsm_symbolic/<data_seed>/<split>/<i>"``), so the sets are the same in every process and do
not depend on the run's ``seed`` (which orders the data and initialises the method): every
run and ``mutor eval`` see the same test sets.
"""

from __future__ import annotations

import importlib.util
from random import Random
from typing import Any, Optional

from ..utils.errors import MutorUserError
from .registry import TrainingData, check_options, register_task
from .templates import TextTemplate

__all__ = ["GSM_SYMBOLIC", "SPLITS", "EVAL_SPLITS", "template_ids", "make_split", "gsm_symbolic_examples"]

SPLITS = ("train", "validation", "test", "test_new_templates")
EVAL_SPLITS = ("test", "test_new_templates")       # what `mutor eval --task gsm_symbolic` reports
_SUFFIX = " Give the result as your final answer. Do not include units."

GSM_SYMBOLIC = TextTemplate(
    name="gsm_symbolic", hub_id="reasoning-gym:gsm_symbolic (generated in process)",
    prompt="Question: {question}\n\nAnswer:", completion=" {answer}", answer_field="answer",
    splits={s: s for s in SPLITS}, max_length=512, max_new_tokens=300, selection="validation",
    notes="GSM-Symbolic templates from reasoning-gym; test = new instances of the training templates, "
          "test_new_templates = templates never seen in training; checkpoints are picked on validation.")

DEFAULTS = {"num_train": 2000, "num_validation": 100, "num_test": 500, "data_seed": 0, "heldout_every": 5,
            "max_length": 512}
_OPTIONS = set(DEFAULTS) | {"num_proc"}


def _generators() -> dict:
    """reasoning-gym's template generators by id, restricted to the templates it marks correct."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise MutorUserError('task gsm_symbolic needs reasoning-gym: pip install -e ".[reasoning-gym]" in the mutor '
                             "checkout (or pip install reasoning-gym)")
    from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import (
        GSMSymbolicDataset,
        GSMSymbolicDatasetConfig,
        tasks_ok,
    )

    gens = GSMSymbolicDataset(GSMSymbolicDatasetConfig(size=1, seed=0)).generators
    return {t: gens[t] for t in tasks_ok}


def template_ids(split: str, heldout_every: int = 5) -> list[int]:
    """Template ids a split draws from: held out (``id % heldout_every == 0``) for ``test_new_templates``,
    the others for ``train``, ``validation`` and ``test``."""
    if split not in SPLITS:
        raise MutorUserError(f"gsm_symbolic has no split {split!r}; splits: {list(SPLITS)}")
    if int(heldout_every) < 2:
        raise MutorUserError(f"gsm_symbolic heldout_every must be >= 2 (got {heldout_every!r})")
    held = split == "test_new_templates"
    return sorted(t for t in _generators() if (t % int(heldout_every) == 0) == held)


def _instance(generator, template: int, seed: str) -> dict:
    ex = generator(Random(seed), 1.0)
    question = ex["question"]
    question = question[:-len(_SUFFIX)] if question.endswith(_SUFFIX) else question
    return {"question": question, "answer": ex["metadata"]["answer_cot"], "value": str(ex["answer"]),
            "template": template}


def make_split(split: str, n: int, data_seed: int = 0, heldout_every: int = 5,
               exclude: Optional[set] = None) -> list[dict]:
    """``n`` distinct instances (by question text) of ``split``'s templates, round-robin over them.

    Each row has ``question``, ``answer`` (the chain of thought, ending ``#### <value>``), ``value``
    and ``template``. Questions in ``exclude`` are skipped; instance ``i`` is drawn from the seed
    string ``gsm_symbolic/<data_seed>/<split>/<i>`` (skipped draws advance ``i``)."""
    if n < 0:
        raise MutorUserError(f"gsm_symbolic: a split size must be >= 0 (got {n})")
    gens = _generators()
    templates = template_ids(split, heldout_every)
    seen = set(exclude or ())
    rows: list[dict] = []
    i = 0
    while len(rows) < n:
        if i > 20 * n + 1000:
            raise RuntimeError(f"gsm_symbolic: could not draw {n} distinct {split} instances")
        t = templates[len(rows) % len(templates)]
        row = _instance(gens[t], t, f"gsm_symbolic/{data_seed}/{split}/{i}")
        i += 1
        if row["question"] in seen:
            continue
        seen.add(row["question"])
        rows.append(row)
    return rows


def gsm_symbolic_splits(num_train: int, num_validation: int, num_test: int, data_seed: int = 0,
                        heldout_every: int = 5) -> dict[str, list[dict]]:
    """All four splits; ``test`` first, then ``validation`` without its questions, then ``train`` without either."""
    test = make_split("test", num_test, data_seed, heldout_every)
    val = make_split("validation", num_validation, data_seed, heldout_every, exclude={r["question"] for r in test})
    train = make_split("train", num_train, data_seed, heldout_every,
                       exclude={r["question"] for r in test + val})
    new = make_split("test_new_templates", num_test, data_seed, heldout_every)
    return {"train": train, "validation": val, "test": test, "test_new_templates": new}


def gsm_symbolic_examples(split: str, limit: Optional[int] = None, model_path: Optional[str] = None) -> list[dict]:
    """Evaluation rows of ``split`` (``test``, ``test_new_templates``, ``validation``) for ``mutor eval``.

    The split's size and seeds are the run's (its ``recipe.yaml`` data block) when ``model_path`` is
    a gsm_symbolic run, else the defaults; ``test`` and ``validation`` are built exactly as in
    training (the same exclusions)."""
    from .text import run_data_block

    opts = {**DEFAULTS, **{k: v for k, v in run_data_block(model_path, "gsm_symbolic").items() if k in DEFAULTS}}
    seed, every, n_test = int(opts["data_seed"]), int(opts["heldout_every"]), int(opts["num_test"])
    if split not in ("validation", "test", "test_new_templates"):
        raise MutorUserError(f"gsm_symbolic evaluates on validation, test or test_new_templates (got {split!r})")
    test = make_split("test", n_test, seed, every) if split in ("test", "validation") else None
    if split == "test":
        rows = test
    elif split == "validation":
        rows = make_split("validation", int(opts["num_validation"]), seed, every,
                          exclude={r["question"] for r in test})
    else:
        rows = make_split("test_new_templates", n_test, seed, every)
    return rows if limit is None else rows[:int(limit)]


@register_task("gsm_symbolic")
def build_gsm_symbolic(options: dict, tokenizer: Any, seed: int) -> TrainingData:
    """Options: ``num_train`` (2000), ``num_validation`` (100; the eval loss set and checkpoint selection),
    ``num_test`` (500 per test split), ``data_seed`` (0; not the run's seed), ``heldout_every`` (5),
    ``max_length`` (512 tokens; longer training examples are dropped), ``num_proc``."""
    from .text import encode_pairs, need_tokenizer, pad_id_of

    check_options(options, _OPTIONS, "gsm_symbolic")
    need_tokenizer(tokenizer, "gsm_symbolic")
    o = {**DEFAULTS, **options}
    for k in ("num_train", "num_validation", "num_test", "data_seed", "heldout_every", "max_length"):
        if not isinstance(o[k], int) or isinstance(o[k], bool):
            raise MutorUserError(f"data.{k} must be an integer (got {o[k]!r})")
    if o["num_train"] < 1:
        raise MutorUserError(f"data.num_train must be >= 1 (got {o['num_train']})")
    splits = gsm_symbolic_splits(o["num_train"], o["num_validation"], o["num_test"], o["data_seed"],
                                 o["heldout_every"])
    max_length = int(o["max_length"])

    train, dropped = encode_pairs(splits["train"], GSM_SYMBOLIC, tokenizer, max_length, o.get("num_proc"))
    if len(train) == 0:
        raise MutorUserError(f"gsm_symbolic: all {o['num_train']} training examples are longer than "
                             f"max_length={max_length} tokens; raise data.max_length")
    eval_ds = (encode_pairs(splits["validation"], GSM_SYMBOLIC, tokenizer, max_length)[0]
               if splits["validation"] else None)
    info = {"num_examples": len(train), "dropped_too_long": dropped, "max_length": max_length,
            "train_templates": len(template_ids("train", o["heldout_every"])),
            "heldout_templates": len(template_ids("test_new_templates", o["heldout_every"])),
            "eval_examples": len(eval_ds) if eval_ds is not None else 0, "num_test": o["num_test"],
            "data_seed": o["data_seed"]}
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=max_length, info=info)
