"""reasoning-gym's path_star graphs mapped onto our star-graph layout: the structure survives the relabelling,
the gold path is the unique valid path in our format, the evaluator runs on them, and `mutor eval --task run
--source path_star` evaluates a star_graph run on them. Fast (pure Python, a tiny random model)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym  # noqa: E402

from mutor.data.path_star import parse_path_star, path_star_examples  # noqa: E402
from mutor.data.star_graph import NUM_SPECIAL, StarGraphShape, evaluate, is_valid_path  # noqa: E402
from mutor.utils.errors import MutorUserError  # noqa: E402


@pytest.mark.parametrize("degree, path_len, num_nodes", [(2, 3, 20), (2, 5, 50), (3, 4, 40)])
def test_mapping_preserves_the_graph_and_its_gold_path(degree, path_len, num_nodes):
    task = StarGraphShape(degree=degree, path_len=path_len, num_nodes=num_nodes)
    exs = path_star_examples(task, 40, seed=3)
    items = reasoning_gym.create_dataset("path_star", size=80, seed=3, degree=degree,
                                         min_path_length=path_len - 1, max_path_length=path_len - 1)
    for ex, item in zip(exs, items):                         # nothing excluded: item i is example i
        edges, source, goal, path = parse_path_star(item)
        # the relabelling is one-to-one and maps their graph onto ours edge by edge, in prompt order
        m = {}
        for (u, v), (a, b) in zip(edges, ex.edges):
            assert m.setdefault(u, a) == a and m.setdefault(v, b) == b
        assert len(set(m.values())) == len(m) == task.nodes_per_graph
        assert all(0 <= x < num_nodes for x in m.values())
        assert (m[source], m[goal], tuple(m[x] for x in path)) == (ex.source, ex.goal, ex.path)
        # our format: a G(degree, path_len) graph whose gold path is the one valid path to the goal
        assert len(ex.edges) == task.num_edges and len(ex.prompt_ids()) == task.prompt_len
        assert is_valid_path(ex, ex.path) and ex.path[-1] == ex.goal and len(ex.path) == path_len
        out = {u: [v for (x, v) in ex.edges if x == u] for u, _ in ex.edges}
        assert len(out[ex.source]) == degree
        assert sum(1 for first in out[ex.source] if _arm_end(out, first) == ex.goal) == 1
        assert ex.answer_ids() == [NUM_SPECIAL + n for n in ex.path]
        assert f"/{ex.source},{ex.goal}=" in ex.text()


def _arm_end(out, node):
    while node in out:
        node = out[node][0]
    return node


def test_training_problems_are_excluded_and_the_set_is_deterministic():
    task = StarGraphShape(degree=2, path_len=3, num_nodes=6)     # few labels: collisions with training happen
    first = path_star_examples(task, 30, seed=0)
    assert path_star_examples(task, 30, seed=0) == first
    banned = {ex.key for ex in first[:10]}
    again = path_star_examples(task, 30, seed=0, exclude=banned)
    assert not {ex.key for ex in again} & banned and len({ex.key for ex in again}) == 30


def test_our_evaluator_runs_on_them_and_agrees_with_an_oracle():
    """A model that always decodes the gold path scores 1.0 on the mapped graphs: the mapping gives our
    evaluator exactly the prompts and answers it expects."""
    import torch

    task = StarGraphShape(degree=2, path_len=4, num_nodes=30)
    exs = path_star_examples(task, 16, seed=1)
    gold = {tuple(ex.prompt_ids()): ex.answer_ids() for ex in exs}

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.device = torch.device("cpu")

        def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
            rows = [gold[tuple(r[m.bool()].tolist())] for r, m in zip(input_ids, attention_mask)]
            return torch.cat([input_ids, torch.tensor(rows)], 1)

        def forward(self, input_ids, attention_mask):
            V = task.vocab_size
            logits = torch.full((*input_ids.shape, V), -1e4)
            logits[:, :-1].scatter_(2, input_ids[:, 1:, None], 0.0)                # (B, T, V): the next token
            return type("Out", (), {"logits": logits})()

    res = evaluate(Oracle(), exs, batch_size=5)
    assert res["solve_rate"] == res["first_hop"] == res["valid_path"] == 1.0 and res["num_eval"] == 16


def test_mutor_eval_run_source_path_star(tmp_path):
    from mutor.eval.harness import evaluate_run_task
    from mutor.models.presets import tiny_causal_lm

    (tmp_path / "recipe.yaml").write_text("method: mutor\nseed: 0\ndata: {task: star_graph, degree: 2, path_len: 3, "
                                          "num_nodes: 20, num_train: 200, num_test: 12}\n")
    shape = StarGraphShape(degree=2, path_len=3, num_nodes=20)
    tiny_causal_lm(shape.vocab_size, seed=0).save_pretrained(tmp_path)
    res = evaluate_run_task(str(tmp_path), output_dir=str(tmp_path / "out"), source="path_star", device="cpu")
    assert res["task"] == "star_graph:path_star" and res["source"] == "path_star" and res["n"] == 12
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["metrics"]["num_eval"] == 12
    with pytest.raises(MutorUserError, match="only 'path_star'"):
        evaluate_run_task(str(tmp_path), source="elsewhere", device="cpu")
