"""data.task: reasoning_gym (any reasoning-gym task, its own verifier): determinism, disjoint splits, the
prompt/completion template with the loss on the answer only, clear errors, and `mutor eval` scoring with
the task's verifier on the splits the run was trained with. Fast: a tiny random model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

from references import random_checkpoint_run  # noqa: E402

from mutor.data.reasoning_tasks import REASONING_GYM, make_splits, reasoning_gym_examples, score  # noqa: E402
from mutor.data.registry import build_training_data  # noqa: E402
from mutor.testing import byte_tokenizer  # noqa: E402
from mutor.utils.errors import MutorUserError  # noqa: E402

OPTS = {"dataset": "word_sorting", "num_train": 40, "num_validation": 10, "num_test": 20}
BIG = {"dataset": "word_sorting", "num_train": 300, "num_validation": 50, "num_test": 300}


def test_splits_are_deterministic_and_no_evaluated_question_is_trained_on():
    a, b = make_splits(OPTS), make_splits(OPTS)
    assert [r["question"] for r in a["train"]] == [r["question"] for r in b["train"]]
    assert {k: len(v) for k, v in a.items()} == {"train": 40, "validation": 10, "test": 20}
    q = {k: {r["question"] for r in v} for k, v in a.items()}
    assert not q["train"] & q["test"] and not q["train"] & q["validation"] and not q["validation"] & q["test"]
    big = make_splits(BIG)                      # splits of the pilot's sizes are disjoint draws, not shifted copies
    assert {k: len(v) for k, v in big.items()} == {"train": 300, "validation": 50, "test": 300}
    assert all(r["index"] == i for rows in big.values() for i, r in enumerate(rows))   # nothing had to be skipped
    other = make_splits({**OPTS, "data_seed": 1})
    assert [r["question"] for r in other["test"]] != [r["question"] for r in a["test"]]


def test_training_rows_are_question_answer_with_the_loss_on_the_answer():
    tok = byte_tokenizer()
    task = build_training_data("reasoning_gym", {**OPTS, "max_length": 4096}, tok, seed=0)
    row = make_splits(OPTS)["train"][0]
    p_ids = tok(f"Question: {row['question']}\n\nAnswer:")["input_ids"]
    c_ids = tok(f" {row['answer']}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ex = task.train_dataset[0]
    assert ex["input_ids"] == p_ids + c_ids and ex["labels"] == [-100] * len(p_ids) + c_ids
    assert len(task.train_dataset) == 40 and len(task.eval_dataset) == 10
    assert task.info["dataset"] == "word_sorting"


def test_the_tasks_own_verifier_scores_the_answer():
    row = make_splits(OPTS)["test"][0]
    assert score(" " + row["answer"] + "\n", row) == {"accuracy": 100.0, "score": 100.0}
    assert score("certainly not", row)["accuracy"] == 0.0


def test_generator_options_reach_the_task():
    rows = make_splits({"dataset": "spell_backward", "config": {"min_word_len": 5, "max_word_len": 5},
                        "num_train": 5, "num_validation": 0, "num_test": 5})
    assert all(len(r["answer"]) == 5 for r in rows["train"] + rows["test"])


@pytest.mark.parametrize("options, needle", [
    ({"dataset": "word_sortin"}, "did you mean 'word_sorting'"),
    ({"dataset": "word_sorting", "config": {"no_such_option": 1}}, "refuses data.config"),
    ({"dataset": "word_sorting", "num_tset": 3}, "num_tset"),
    ({"dataset": "word_sorting", "config": [1]}, "data.config must be a mapping"),
])
def test_bad_options_are_named(options, needle):
    with pytest.raises(MutorUserError, match=needle):
        build_training_data("reasoning_gym", options, byte_tokenizer(), 0)


def test_eval_rebuilds_the_runs_splits_and_refuses_another_run(tmp_path):
    (tmp_path / "recipe.yaml").write_text("data: {task: reasoning_gym, dataset: word_sorting, num_test: 6, "
                                          "num_validation: 3}\n")
    ck = tmp_path / "checkpoint-5"
    ck.mkdir()
    test = reasoning_gym_examples("test", model_path=str(ck))
    assert [r["question"] for r in test] == [r["question"] for r in make_splits(
        {"dataset": "word_sorting", "num_test": 6, "num_validation": 3, "num_train": 0})["test"]]
    other = tmp_path / "other"
    other.mkdir()
    (other / "recipe.yaml").write_text("data: {task: gsm_symbolic}\n")
    with pytest.raises(MutorUserError, match="data.task: reasoning_gym"):
        reasoning_gym_examples("test", model_path=str(other))


def test_mutor_eval_scores_with_the_verifier_and_selects_on_validation(tmp_path):
    from mutor.eval.harness import evaluate_checkpoints

    tok = byte_tokenizer()
    random_checkpoint_run(tmp_path, "{task: reasoning_gym, dataset: spell_backward, num_test: 3, num_validation: 2}",
                          tok)
    res = evaluate_checkpoints("reasoning_gym", str(tmp_path), max_new_tokens=2, progress=False, device="cpu")
    assert res["selection_split"] == "validation" and res["n"] == 3 and REASONING_GYM.selection == "validation"
    gens = [json.loads(x) for x in (tmp_path / "eval" / "reasoning_gym" / res["selected_checkpoint"] / "test" /
                                    "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 3 and all({"accuracy", "score"} <= set(g) for g in gens)


def test_an_item_the_generator_fails_on_is_skipped(monkeypatch):
    """reasoning-gym's maze raises RuntimeError on some seeds: such an item is skipped, not fatal."""
    import reasoning_gym

    real = reasoning_gym.create_dataset

    class Flaky:
        def __init__(self, ds):
            self.ds = ds

        def __getitem__(self, i):
            if i % 3 == 1:
                raise RuntimeError("Could not find suitable path cell after 1000 attempts")
            return self.ds[i]

    monkeypatch.setattr(reasoning_gym, "create_dataset", lambda *a, **kw: Flaky(real(*a, **kw)))
    rows = make_splits({**OPTS, "num_train": 5, "num_validation": 3, "num_test": 4})
    assert [len(rows[k]) for k in ("train", "validation", "test")] == [5, 3, 4]
    assert all(r["index"] % 3 != 1 for split in rows.values() for r in split)
