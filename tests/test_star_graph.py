"""The star-graph task: generator validity, split, tokens, batched decoding, and the default `mutor train` job."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from mutor.data import star_graph as demo
from mutor.data.collator import PaddingCollator, left_pad
from mutor.models.presets import tiny_causal_lm
from mutor.run.cli import build_parser, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TASKS = [demo.StarGraphShape(), demo.StarGraphShape(degree=3, path_len=4, num_nodes=20),
         demo.StarGraphShape(degree=2, path_len=3, num_nodes=6)]


# ----------------------------------------------------------------------- task


@pytest.mark.parametrize("task", TASKS, ids=str)
def test_answer_path_follows_listed_edges(task):
    for ex in demo.make_examples(task, 200, seed=3):
        edges = set(ex.edges)
        assert len(ex.edges) == len(edges) == task.num_edges
        nodes = {n for e in ex.edges for n in e}
        assert len(nodes) == task.nodes_per_graph and all(0 <= n < task.num_nodes for n in nodes)
        # star shape: the source has `degree` out-edges, every other node at most one, no node two in-edges
        outs = [u for u, _ in ex.edges]
        ins = [v for _, v in ex.edges]
        assert outs.count(ex.source) == task.degree and ex.source not in ins
        assert all(outs.count(n) <= 1 for n in nodes - {ex.source}) and len(set(ins)) == len(ins)
        # the answer: source -> goal along listed edges, goal is a leaf, and it is the only such path
        assert len(ex.path) == task.path_len
        assert ex.path[0] == ex.source and ex.path[-1] == ex.goal and ex.goal not in outs
        assert all((u, v) in edges for u, v in zip(ex.path[:-1], ex.path[1:]))
        assert demo.is_valid_path(ex, ex.path)
        succ = dict((u, v) for u, v in ex.edges if u != ex.source)
        reach = []
        for _, first in (e for e in ex.edges if e[0] == ex.source):
            walk = [ex.source, first]
            while walk[-1] in succ:
                walk.append(succ[walk[-1]])
            reach.append(tuple(walk))
        assert [w for w in reach if w[-1] == ex.goal] == [ex.path]


def test_tokens_and_labels():
    task = demo.StarGraphShape()
    ex = demo.make_examples(task, 1, seed=0)[0]
    item = demo.StarGraphDataset([ex])[0]
    prompt, answer = ex.prompt_ids(), ex.answer_ids()
    assert len(prompt) == task.prompt_len and len(item["input_ids"]) == task.seq_len
    assert item["input_ids"] == prompt + answer
    assert item["labels"] == [-100] * len(prompt) + answer
    assert prompt[-1] == demo.ANSWER_SEP and prompt.count(demo.QUERY_SEP) == 1
    assert max(item["input_ids"]) < task.vocab_size
    text = ex.text()
    assert text.endswith("=" + ",".join(map(str, ex.path)))
    assert text.count("|") == task.num_edges - 1


def test_generator_is_deterministic_per_seed():
    task = demo.StarGraphShape(degree=2, path_len=4, num_nodes=20)
    a = demo.make_examples(task, 100, seed=7)
    assert a == demo.make_examples(task, 100, seed=7)
    assert a != demo.make_examples(task, 100, seed=8)
    assert demo.split_examples(task, 300, 50, seed=1) == demo.split_examples(task, 300, 50, seed=1)
    # independent of the global RNGs
    random.seed(123)
    torch.manual_seed(123)
    assert demo.make_examples(task, 100, seed=7) == a


@pytest.mark.parametrize("task", [demo.StarGraphShape(), demo.StarGraphShape(degree=2, path_len=3, num_nodes=6)],
                         ids=str)
def test_test_examples_not_in_training(task):
    train, test = demo.split_examples(task, 400, 100, seed=0)
    assert len(train) == 400 and len(test) == 100
    train_keys = {ex.key for ex in train}
    assert len(train_keys) == len(train) and len({ex.key for ex in test}) == len(test)
    assert not train_keys & {ex.key for ex in test}
    # the key ignores edge order: a reshuffled copy of a test graph counts as the same problem
    ex = test[0]
    shuffled = demo.Example(edges=tuple(reversed(ex.edges)), source=ex.source, goal=ex.goal, path=ex.path)
    assert shuffled.key == ex.key


def test_too_few_nodes_or_graphs_raise():
    with pytest.raises(ValueError):
        demo.StarGraphShape(degree=2, path_len=5, num_nodes=8)
    tiny = demo.StarGraphShape(degree=2, path_len=3, num_nodes=5)       # 5 sources * 12 graphs * 2 goals = 120
    assert len(demo.make_examples(tiny, 120, seed=0)) == 120
    with pytest.raises(RuntimeError):
        demo.make_examples(tiny, 121, seed=0)


def test_is_valid_path_rejects_wrong_paths():
    ex = demo.make_examples(demo.StarGraphShape(), 1, seed=5)[0]
    other_arm = [v for u, v in ex.edges if u == ex.source and v != ex.path[1]][0]
    assert not demo.is_valid_path(ex, ex.path[::-1])
    assert not demo.is_valid_path(ex, ex.path[:-1])
    bad = list(ex.path)
    bad[1] = other_arm                                                   # wrong arm, then continues the right one
    assert not demo.is_valid_path(ex, bad)


def test_collators_pad_on_the_right_side():
    feats = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}]
    b = PaddingCollator(pad_token_id=demo.PAD)(feats)
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, demo.PAD, demo.PAD]]
    assert b["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = left_pad([[5, 6, 7], [8]], demo.PAD)
    assert ids.tolist() == [[5, 6, 7], [demo.PAD, demo.PAD, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_batched_left_padded_greedy_matches_one_by_one():
    """Left padding must not change what greedy decoding produces (prompts of different lengths)."""
    examples = (demo.make_examples(demo.StarGraphShape(degree=2, path_len=4, num_nodes=20), 3, seed=0)
                + demo.make_examples(demo.StarGraphShape(degree=3, path_len=4, num_nodes=20), 3, seed=0))
    task = demo.StarGraphShape(degree=3, path_len=4, num_nodes=20)
    base = tiny_causal_lm(task.vocab_size, seed=0, max_position_embeddings=64, bos_token_id=None, eos_token_id=None)
    ids, mask = left_pad([ex.prompt_ids() for ex in examples], demo.PAD)
    with torch.no_grad():
        batched = base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4,
                                do_sample=False)[:, ids.shape[1]:]
        for i, ex in enumerate(examples):
            one = torch.tensor([ex.prompt_ids()])
            single = base.generate(input_ids=one, attention_mask=torch.ones_like(one), max_new_tokens=4,
                                   min_new_tokens=4, do_sample=False)[:, one.shape[1]:]
            assert batched[i].tolist() == single[0].tolist()


# ------------------------------------------------------------------- the default job


def test_default_recipe_is_the_star_graph_comparison():
    args = build_parser().parse_args(["train"])
    assert args.recipe == "star-graph" and args.overrides == []
    from mutor.run.recipe import load_recipe

    r = load_recipe("star-graph")
    assert r.methods == ["next_token", "mutor"] and r.data["task"] == "star_graph"
    assert r.method_config("mutor").min_offset == 2 and r.data["path_len"] == 3 and r.data["num_nodes"] == 20
    with pytest.raises(SystemExit):
        build_parser().parse_args([])


@pytest.mark.parametrize("name", ["g2-5-cpu", "g2-5", "g2-10", "gpt2-large-g2-5", "gpt2-large-g2-10",
                                  "smollm2-135m-g2-5", "smollm2-135m-g2-10"])
def test_star_graph_preset_names_match_their_graphs(name):
    """star_graph/g{degree}-{path_len}*.yaml trains on exactly that graph: a recipe's name says what it trains."""
    import re

    from mutor.run.recipe import load_recipe

    degree, path_len = map(int, re.search(r"g(\d+)-(\d+)", name).groups())
    r = load_recipe(f"star_graph/{name}")
    assert (r.data["degree"], r.data["path_len"]) == (degree, path_len)
    assert r.method_config("mutor").min_offset == 2


def test_unknown_option_is_named():
    from mutor.data import build_training_data

    with pytest.raises(ValueError, match="colour"):
        build_training_data("star_graph", {"colour": 1}, None)


def _finite_numbers(obj):
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, (int, float)):
        assert math.isfinite(obj), obj
    elif isinstance(obj, dict):
        for v in obj.values():
            _finite_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            _finite_numbers(v)


def test_tiny_default_job_end_to_end(tmp_path, capsys):
    """`mutor train` (the default recipe) at smoke size: table, verdict, comparison files, curves."""
    assert main(["train", "training.max_steps=6", "training.eval_steps=3", "training.save_steps=6",
                 "training.logging_steps=3", "data.num_train=200", "data.num_test=16", "data.path_len=4",
                 "data.num_nodes=20", "model.preset=tiny-llama", "training.disable_tqdm=true",
                 "--output-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "next_token" in printed and "mutor" in printed and "solve_rate" in printed and "within noise" in printed
    results = json.loads((tmp_path / "comparison.json").read_text())
    runs = {r["method"]: r for r in results["runs"]}
    assert set(runs) == {"next_token", "mutor"}
    for run in runs.values():
        assert run["global_step"] == 6
        assert [h["eval_step"] for h in run["eval_history"]] == [0, 3, 6]
        final = run["eval_history"][-1]
        for k in ("eval_solve_rate", "eval_first_hop", "eval_valid_path"):
            assert 0.0 <= final[k] <= 1.0
        assert final["eval_ntp_loss"] > 0
        _finite_numbers(run)
    # same initialisation and held-out set: the step-0 evaluations agree exactly
    strip = lambda h: {k: v for k, v in h.items() if k not in ("epoch",)}  # noqa: E731
    assert strip(runs["next_token"]["eval_history"][0]) == strip(runs["mutor"]["eval_history"][0])
    assert "reg_loss" in runs["mutor"]["train_history"][-1]
    png = tmp_path / "curves.png"
    assert png.is_file() and png.read_bytes()[:8] == PNG_MAGIC
    md = (tmp_path / "comparison.md").read_text()
    assert "| next_token |" in md and "| mutor |" in md and "solve_rate" in md
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]      # no temporaries left behind


def test_continue_training_from_a_local_run(tmp_path):
    """A trained run is a vanilla model directory: a recipe can start from it (no tokenizer needed)."""
    from mutor.run.train import run_recipe

    small = ["training.save_steps=2", "training.eval_steps=2", "data.num_train=64", "data.num_test=8",
             "data.path_len=4", "data.num_nodes=20", "model.preset=tiny-llama", "training.report_to=[]"]
    run_recipe("star-graph", ["method=next_token", "training.max_steps=2", f"training.output_dir={tmp_path / 'a'}",
                              *small], quiet=True)
    out = run_recipe("star-graph", ["method=mutor", "training.max_steps=2", f"training.output_dir={tmp_path / 'b'}",
                                    f"model.name_or_path={tmp_path / 'a'}", *small], quiet=True)
    run = out["runs"][0]
    a0 = json.loads((tmp_path / "a" / "summary.json").read_text())["eval_history"][-1]
    assert run["eval_history"][0]["eval_ntp_loss"] == pytest.approx(a0["eval_ntp_loss"], rel=1e-6)   # same weights


@pytest.mark.parametrize("recipe", ["star_graph/gpt2-large-g2-5", "star_graph/gpt2-large-g2-10"])
def test_gpt2_recipes_run_with_a_tiny_local_gpt2(recipe, tmp_path):
    """The paper-scale recipes' mechanics (a from_pretrained GPT-2 with learned absolute positions, the task's
    ids mapped onto its vocabulary) on a tiny random GPT-2 saved locally in place of the Hub weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from mutor.run.train import run_recipe

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=160, n_positions=128, n_embd=32, n_layer=2, n_head=2)).save_pretrained(
        tmp_path / "gpt2")
    out = run_recipe(recipe, [f"model.name_or_path={tmp_path / 'gpt2'}", "training.bf16=false", "training.max_steps=2",
                              "training.eval_steps=2", "training.save_steps=2", "training.logging_steps=1",
                              "training.report_to=[]",
                              "data.num_train=64", "data.num_test=8", "training.per_device_train_batch_size=4",
                              f"training.output_dir={tmp_path / 'run'}"], quiet=True)
    runs = {r["method"]: r for r in out["runs"]}
    assert set(runs) == {"next_token", "mutor"}
    for run in runs.values():
        assert run["global_step"] == 2 and run["eval_history"][-1]["eval_num_eval"] == 8
    assert runs["mutor"]["parameters"]["added_by_method"] == 32            # one register vector of the hidden size
    assert "reg_loss" in runs["mutor"]["train_history"][-1]
