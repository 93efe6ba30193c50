"""The paper's templates and filters, on small fixture files (no Hub access)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mutor.data import build_training_data
from mutor.data.templates import TEMPLATES, get_template, render_completion, render_prompt
from mutor.data.text import build_from_template
from mutor.run.build import training_arguments
from mutor.run.recipe import CONFIG_DIR, load_recipe
from mutor.testing import byte_tokenizer

FIX = Path(__file__).parent / "fixtures" / "data"


def _decode_parts(tok, ex):
    n = sum(1 for x in ex["labels"] if x == -100)
    return tok.decode(ex["input_ids"][:n]), tok.decode(ex["input_ids"][n:-1])


@pytest.mark.parametrize("name, sources", [("omi2_1m_gsm", {"gsm8k", "augmented_gsm8k"}),
                                           ("omi2_2m_gsm", {"gsm8k", "augmented_gsm8k"}),
                                           ("omi2_1m_math", {"math", "augmented_math"})])
def test_openmathinstruct_subsets_filter_by_problem_source(name, sources):
    import datasets

    template = get_template(name)
    rows = datasets.load_dataset("json", data_files=str(FIX / "omi2_tiny.jsonl"), split="train")
    kept = rows.filter(template.filter)
    assert len(kept) == 8 and set(kept["problem_source"]) == sources
    data = build_training_data(name, {"path": str(FIX / "omi2_tiny.jsonl")}, byte_tokenizer())
    assert data.info["num_examples"] == 8
    prompt, completion = _decode_parts(byte_tokenizer(), data.train_dataset[0])
    assert prompt.startswith("Question: Problem ") and prompt.endswith("\n\nAnswer:")
    assert completion.startswith(" ") and "\\boxed{" in completion


def test_math_sample_is_a_fixed_seeded_subset():
    template = dataclasses.replace(get_template("omi2_1m_math"), sample=3, sample_seed=0)
    tok = byte_tokenizer()
    a = build_from_template(template, {"path": str(FIX / "omi2_tiny.jsonl")}, tok, seed=0)
    b = build_from_template(template, {"path": str(FIX / "omi2_tiny.jsonl")}, tok, seed=5)   # run seed: same subset
    assert len(a.train_dataset) == 3 and a.train_dataset["input_ids"] == b.train_dataset["input_ids"]
    other = build_from_template(dataclasses.replace(template, sample_seed=1), {"path": str(FIX / "omi2_tiny.jsonl")},
                                tok, seed=0)
    assert other.train_dataset["input_ids"] != a.train_dataset["input_ids"]


def test_aqua_rat_template_lists_options_and_ends_with_the_letter():
    tok = byte_tokenizer()
    data = build_training_data("aqua_rat", {"path": str(FIX / "aqua_tiny.jsonl")}, tok)
    prompt, completion = _decode_parts(tok, data.train_dataset[0])
    assert prompt == ("Question: A train covers 60 km in 1.5 hours. What is its speed?\nOptions:\n"
                      "A) 30\nB) 40\nC) 45\nD) 50\nE) 90\n\nAnswer:")
    assert completion == " Speed = 60 / 1.5 = 40 km/h.\nThe answer is B"


def test_summarization_and_gsm8k_templates_are_the_papers():
    ex = {"dialogue": "A: hi\nB: hello", "summary": "They greet.", "question": "1+1?", "answer": "2\n#### 2"}
    assert render_prompt(get_template("samsum"), ex) == "Dialogue:\nA: hi\nB: hello\n\nSummary:"
    assert render_completion(get_template("dialogsum"), ex) == " They greet."
    assert render_prompt(get_template("gsm8k"), ex) == "Question: 1+1?\n\nAnswer:"
    assert render_completion(get_template("gsm8k"), ex) == " 2\n#### 2"


def test_missing_field_and_unknown_task_are_named():
    with pytest.raises(ValueError, match="'question'"):
        render_prompt(get_template("gsm8k"), {"problem": "x"})
    with pytest.raises(ValueError, match="unknown data.task 'gsm9k'"):
        build_training_data("gsm9k", {}, byte_tokenizer())
    with pytest.raises(ValueError, match="needs a tokenizer"):
        build_training_data("gsm8k", {"path": str(FIX / "omi2_tiny.jsonl")}, None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_training_data("gsm8k", {"path": "/nonexistent.jsonl"}, byte_tokenizer())


def test_every_task_has_the_papers_length_limit():
    for name, template in TEMPLATES.items():
        expected = 768 if name in ("omi2_1m_math", "math500", "samsum", "dialogsum") else 512
        assert template.max_length == expected, name


RECIPES = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if "accelerate" not in p.relative_to(CONFIG_DIR).parts)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_shipped_recipe_validates(path, tmp_path):
    import dataclasses

    from transformers import TrainingArguments

    recipe = load_recipe(path)
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(recipe.training) <= fields, sorted(set(recipe.training) - fields)
    if not (recipe.training.get("bf16") or recipe.training.get("fp16")):    # mixed precision needs a GPU to build
        training_arguments(recipe.training, recipe.seed, tmp_path)
    for m in recipe.methods:
        if m == "mutor":
            recipe.method_config("mutor")
