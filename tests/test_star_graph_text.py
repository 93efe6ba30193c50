"""star_graph with render: text (the line format as text for a pretrained tokenizer): the rendering, labels on
the path only, the evaluator against an oracle, and a text run end to end (`mutor train`, then `mutor eval
--task run` with and without reasoning-gym's path_star graphs). Fast: byte tokenizer, tiny random model."""

from __future__ import annotations

import json

import pytest
import torch

from mutor.data.registry import build_training_data
from mutor.data.star_graph import StarGraphShape, split_examples
from mutor.data.star_graph_text import evaluate, parse_path, render
from mutor.testing import byte_tokenizer

OPTS = {"render": "text", "degree": 2, "path_len": 4, "num_nodes": 30, "num_train": 40, "num_test": 8}


def test_render_is_bachmann_nagarajans_line_format_and_parses_back():
    shape = StarGraphShape(degree=2, path_len=4, num_nodes=30)
    _, test = split_examples(shape, 10, 5, seed=0)
    ex = test[0]
    prompt, completion = render(ex)
    assert prompt == "|".join(f"{u},{v}" for u, v in ex.edges) + f"/{ex.source},{ex.goal}="
    assert completion == ",".join(map(str, ex.path)) and parse_path(completion) == ex.path
    assert parse_path(" 3, 14,15\nmore 9") == (3, 14, 15) and parse_path("no path") == ()


def test_text_task_labels_only_the_path_and_eos():
    tok = byte_tokenizer()
    task = build_training_data("star_graph", OPTS, tok, seed=0)
    ex, feat = task.train_dataset.examples[0], task.train_dataset[0]
    prompt, completion = render(ex)
    p_ids = tok(prompt)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert feat["input_ids"] == p_ids + c_ids and feat["labels"] == [-100] * len(p_ids) + c_ids
    assert task.primary_metric == "solve_rate" and task.vocab_size is None and "as text" in task.info["task"]


def test_render_must_be_known_and_text_needs_a_tokenizer():
    with pytest.raises(ValueError, match="render must be"):
        build_training_data("star_graph", {**OPTS, "render": "words"}, byte_tokenizer(), 0)
    with pytest.raises(ValueError, match="tokenizer"):
        build_training_data("star_graph", OPTS, None, 0)


def test_evaluator_scores_an_oracle_one_and_a_wrong_first_hop_zero():
    tok = byte_tokenizer()
    shape = StarGraphShape(degree=2, path_len=4, num_nodes=30)
    _, test = split_examples(shape, 10, 6, seed=1)
    gold = {tuple(tok(render(ex)[0])["input_ids"]): ex for ex in test}

    class Oracle(torch.nn.Module):
        def __init__(self, wrong_hop: bool):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.wrong_hop = wrong_hop

        def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
            rows = []
            for r, m in zip(input_ids, attention_mask):
                ex = gold[tuple(r[m.bool()].tolist())]
                path = list(ex.path)
                if self.wrong_hop:      # the other arm's first node: a listed edge, the wrong way
                    path[1] = next(v for u, v in ex.edges if u == ex.source and v != ex.path[1])
                rows.append(tok(",".join(map(str, path)), add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
            width = max(map(len, rows))
            rows = [x + [tok.eos_token_id] * (width - len(x)) for x in rows]
            return torch.cat([input_ids, torch.tensor(rows)], 1)

        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, len(tok))})()

    right = evaluate(Oracle(False), tok, test, batch_size=4)
    assert right["solve_rate"] == right["first_hop"] == right["valid_path"] == 1.0 and right["num_eval"] == 6
    records = []
    wrong = evaluate(Oracle(True), tok, test, batch_size=4, records=records)
    assert wrong["solve_rate"] == wrong["first_hop"] == 0.0
    assert [r["reference"] for r in records] == [list(ex.path) for ex in test]     # one record per graph, in order
    assert all(r["solve_rate"] == r["first_hop"] == 0 and r["prediction"][0] == r["reference"][0] for r in records)


def test_text_run_trains_and_evaluates_end_to_end(tmp_path):
    from mutor.eval.harness import evaluate_run_task
    from mutor.run.cli import main

    out = tmp_path / "run"
    assert main(["train", "star_graph/g2-5-cpu", "method=mutor", "model.preset=tiny-llama", "model.tokenizer=byte",
                 "data.render=text", "data.num_train=64", "data.num_test=8", "data.num_nodes=20", "data.path_len=4",
                 "training.max_steps=2", "training.eval_steps=2", "training.save_steps=2", "training.logging_steps=1",
                 "training.report_to=[]", "--output-dir", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_history"][-1]["eval_solve_rate"] >= 0.0
    res = evaluate_run_task(str(out), output_dir=str(tmp_path / "eval"), device="cpu")
    assert res["n"] == 8 and 0.0 <= res["metrics"]["first_hop"] <= 1.0
    import importlib.util

    if importlib.util.find_spec("reasoning_gym") is not None:   # --source path_star: reasoning-gym's graphs
        res = evaluate_run_task(str(out), output_dir=str(tmp_path / "eval-ps"), device="cpu", source="path_star")
        assert res["source"] == "path_star" and res["n"] == 8
