"""gsm_symbolic (reasoning-gym's GSM-Symbolic generators): determinism, split disjointness by template and
by question, the paper's GSM8K template, the GSM8K metric on every template's gold chain of thought, and
`mutor eval`'s two test splits. Fast: generation is pure Python; the model is a tiny random one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym")

from references import random_checkpoint_run  # noqa: E402

from mutor.data.gsm_symbolic import (  # noqa: E402
    DEFAULTS,
    GSM_SYMBOLIC,
    gsm_symbolic_examples,
    gsm_symbolic_splits,
    make_split,
    template_ids,
)
from mutor.data.registry import build_training_data  # noqa: E402
from mutor.eval import metrics  # noqa: E402
from mutor.testing import byte_tokenizer  # noqa: E402
from mutor.utils.errors import MutorUserError  # noqa: E402

SUFFIX = "Give the result as your final answer."


@pytest.fixture(scope="module")
def splits():
    return gsm_symbolic_splits(num_train=300, num_validation=40, num_test=120)


def test_same_rows_in_every_call_and_every_process(splits):
    again = gsm_symbolic_splits(num_train=300, num_validation=40, num_test=120)
    assert again == splits
    code = ("import json; from mutor.data.gsm_symbolic import make_split; "
            "print(json.dumps(make_split('test', 30) + make_split('test_new_templates', 30)))")
    other = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                      env={"PYTHONHASHSEED": "123", **__import__("os").environ}).stdout)
    assert other == splits["test"][:30] + splits["test_new_templates"][:30]
    # a different data_seed gives different instances
    assert make_split("test", 30, data_seed=1) != splits["test"][:30]


def test_templates_split_by_the_fixed_rule():
    train_t, new_t = set(template_ids("train")), set(template_ids("test_new_templates"))
    assert train_t and new_t and not train_t & new_t
    assert all(t % 5 == 0 for t in new_t) and all(t % 5 != 0 for t in train_t)
    assert len(train_t | new_t) == 85                       # reasoning-gym's tasks_ok
    assert set(template_ids("test")) == set(template_ids("validation")) == train_t


def test_splits_are_disjoint_by_template_and_by_question(splits):
    held = set(template_ids("test_new_templates"))
    for name in ("train", "validation", "test"):
        assert not {r["template"] for r in splits[name]} & held, name
    assert {r["template"] for r in splits["test_new_templates"]} == held   # 120 rows round-robin over 17
    assert {r["template"] for r in splits["train"]} == set(template_ids("train"))
    q = {k: {r["question"] for r in v} for k, v in splits.items()}
    assert len(q["train"]) == 300 and len(q["test"]) == 120 and len(q["validation"]) == 40   # distinct within
    assert not q["train"] & q["test"] and not q["train"] & q["validation"] and not q["validation"] & q["test"]
    assert not q["test_new_templates"] & (q["train"] | q["test"])


def test_gold_chain_of_thought_scores_correct_on_every_template():
    for split in ("train", "test_new_templates"):
        templates = template_ids(split)
        rows = make_split(split, 3 * len(templates))
        assert {r["template"] for r in rows} == set(templates)
        for r in rows:
            assert r["answer"].rstrip().splitlines()[-1].startswith("#### "), r["answer"][-60:]
            assert metrics.gsm8k_correct(r["answer"], r["value"]), (r["template"], r["answer"][-60:], r["value"])
            assert metrics.extract_gsm8k(r["answer"]) == metrics.extract_gsm8k(r["value"])
            assert not metrics.gsm8k_correct(r["answer"], str(int(float(r["value"])) + 1))
            assert SUFFIX not in r["question"]


def test_training_rows_use_the_papers_gsm8k_template():
    tok = byte_tokenizer()
    task = build_training_data("gsm_symbolic",
                               {"num_train": 12, "num_validation": 4, "num_test": 8, "max_length": 4096},
                               tok, seed=0)   # bytes: nothing is dropped
    rows = gsm_symbolic_splits(num_train=12, num_validation=4, num_test=8)["train"]
    assert len(task.train_dataset) == 12 and len(task.eval_dataset) == 4
    ex, row = task.train_dataset[0], rows[0]
    prompt = f"Question: {row['question']}\n\nAnswer:"
    completion = f" {row['answer']}"
    p_ids = tok(prompt)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ex["input_ids"] == p_ids + c_ids
    assert ex["labels"] == [-100] * len(p_ids) + c_ids
    assert GSM_SYMBOLIC.prompt.format(**row) == prompt and GSM_SYMBOLIC.completion.format(**row) == completion
    assert task.info["train_templates"] == 68 and task.info["heldout_templates"] == 17


def test_bad_options_are_named():
    tok = byte_tokenizer()
    with pytest.raises(MutorUserError, match="num_trian"):
        build_training_data("gsm_symbolic", {"num_trian": 3}, tok, 0)
    with pytest.raises(MutorUserError, match="no split"):
        template_ids("dev")
    with pytest.raises(ValueError, match="tokenizer"):
        build_training_data("gsm_symbolic", {}, None, 0)


def test_eval_reads_the_runs_data_options(tmp_path):
    (tmp_path / "recipe.yaml").write_text("data: {task: gsm_symbolic, num_test: 7, data_seed: 3}\n")
    ck = tmp_path / "checkpoint-5"
    ck.mkdir()
    rows = gsm_symbolic_examples("test", model_path=str(ck))
    assert rows == make_split("test", 7, data_seed=3)
    assert len(gsm_symbolic_examples("test_new_templates")) == DEFAULTS["num_test"]
    # validation as in training: without the test questions
    val = gsm_symbolic_examples("validation", model_path=str(ck))
    assert not {r["question"] for r in val} & {r["question"] for r in rows}


def test_mutor_eval_scores_both_test_splits(tmp_path):
    """`mutor eval --task gsm_symbolic` on a tiny random model: both splits, each its own compare column."""
    from mutor.eval.harness import evaluate_model, get_benchmark
    from mutor.models.presets import tiny_causal_lm

    tok = byte_tokenizer()
    model = tiny_causal_lm(len(tok), seed=0).eval()
    task = get_benchmark("gsm_symbolic")
    assert task.test_splits == ("test", "test_new_templates")
    out = {}
    for split in task.test_splits:
        out[split] = evaluate_model("gsm_symbolic", str(tmp_path), split=split, limit=2, max_new_tokens=3,
                                    model_and_tokenizer=(model, tok), progress=False,
                                    output_dir=str(tmp_path / split))
    assert out["test"]["task"] == "gsm_symbolic"
    assert out["test_new_templates"]["task"] == "gsm_symbolic:test_new_templates"
    gens = [json.loads(line)
            for line in (tmp_path / "test_new_templates" / "generations.jsonl").read_text().splitlines()]
    new = make_split("test_new_templates", 2)
    assert [g["prompt"] for g in gens] == [f"Question: {r['question']}\n\nAnswer:" for r in new]
    assert [g["reference"] for g in gens] == [r["answer"] for r in new]
    assert all(g["accuracy"] == 0.0 for g in gens)               # 3 random tokens are never the answer


def test_checkpoint_selection_on_validation_reports_both_test_splits(tmp_path):
    """`mutor eval --task gsm_symbolic --checkpoints RUN`: picked on validation, scored on test and on
    test_new_templates, each written as its own selection summary (two columns in `mutor compare`)."""
    from mutor.eval.compare import collect_summaries, comparison_table
    from mutor.eval.harness import evaluate_checkpoints

    tok = byte_tokenizer()
    random_checkpoint_run(tmp_path, "{task: gsm_symbolic, num_test: 3, num_validation: 2}", tok)
    res = evaluate_checkpoints("gsm_symbolic", str(tmp_path), max_new_tokens=2, progress=False, device="cpu")
    assert res["selection_split"] == "validation" and res["split"] == "test" and res["n"] == 3
    other = res["other_splits"]["test_new_templates"]
    assert other["n"] == 3
    saved = json.loads((tmp_path / "eval" / "gsm_symbolic" / "summary.json").read_text())
    assert saved["other_splits"]["test_new_templates"]["n"] == 3
    # every split inside the output directory (nothing beside it), as with --model
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["gsm_symbolic"]
    assert (tmp_path / "eval" / "gsm_symbolic" / "test_new_templates" / "summary.json").is_file()
    table = comparison_table(collect_summaries([str(tmp_path / "eval")]))
    assert "gsm_symbolic accuracy" in table and "gsm_symbolic:test_new_templates accuracy" in table
