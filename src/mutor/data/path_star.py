"""reasoning-gym's ``path_star`` graphs as an independent source of test graphs for our star-graph evaluator.

reasoning-gym (``pip install -e ".[reasoning-gym]"`` in the mutor checkout)
generates path-star graphs with its own code, its own
random streams and its own text format: a natural-language instruction, then
``|u v|u v|.../s g = `` with node labels up to ``node_range`` (100,000), and the answer
``"s a1 ... g"``. Its ``path_length`` counts the nodes of one arm *without* the centre; ours
(:class:`~mutor.data.star_graph.StarGraphShape`) counts the answer path *with* the source, so
reasoning-gym's ``path_length`` is our ``path_len - 1`` and its ``degree`` is ours.

What is unusual here: nothing of reasoning-gym's metadata is trusted on its own. Each graph is read
back from the prompt text (edges in prompt order, source and goal) and the answer string, checked
against the metadata (``center``, ``goal``, ``goal_path``) and against the path-star shape (the
source has ``degree`` out-edges, every arm is a chain of ``path_len - 1`` nodes, the answer walks
listed edges from the source to the goal), and only then relabelled: the graph's distinct labels, in
sorted order, get distinct ids drawn from our ``num_nodes`` with a seed per graph. Relabelling by a
bijection keeps the structure; the edge order of the prompt is kept, so the only thing that differs
from a graph of our own generator is who drew it. A graph that repeats a training problem
(:attr:`~mutor.data.star_graph.Example.key`) can be dropped with ``exclude``.
"""

from __future__ import annotations

import importlib.util
import re
from random import Random
from typing import Optional

from ..utils.errors import MutorUserError
from .star_graph import Example, StarGraphShape, is_valid_path

__all__ = ["parse_path_star", "relabel", "path_star_examples"]

_EDGE = re.compile(r"\|(\d+) (\d+)")
_QUERY = re.compile(r"/(\d+) (\d+) = ")


def parse_path_star(item: dict) -> tuple[list[tuple[int, int]], int, int, list[int]]:
    """(edges in prompt order, source, goal, gold path) of one reasoning-gym ``path_star`` item, in its labels."""
    task = item["question"].split("Solve the following task:", 1)[-1]
    edges = [(int(u), int(v)) for u, v in _EDGE.findall(task)]
    query = _QUERY.findall(task)
    if not edges or len(query) != 1:
        raise ValueError(f"path_star item {item.get('metadata', {}).get('source_index')}: cannot read the graph "
                         f"from {task.strip()[:80]!r}")
    source, goal = (int(x) for x in query[0])
    path = [int(x) for x in item["answer"].split()]
    meta = item.get("metadata", {})
    if (meta.get("center"), meta.get("goal"), list(meta.get("goal_path", []))) != (source, goal, path):
        raise ValueError(f"path_star item {meta.get('source_index')}: prompt and metadata disagree")
    return edges, source, goal, path


def _check_shape(edges, source, goal, path, shape: StarGraphShape) -> None:
    out = {}
    for u, v in edges:
        out.setdefault(u, []).append(v)
    arms = out.get(source, [])
    ok = len(edges) == shape.num_edges and len(arms) == shape.degree and path[0] == source and path[-1] == goal \
        and len(path) == shape.path_len
    for first in arms if ok else []:
        chain, node = [first], first
        while node in out:
            if len(out[node]) != 1:
                ok = False
                break
            node = out[node][0]
            chain.append(node)
        ok = ok and len(chain) == shape.path_len - 1
    ok = ok and all((u, v) in set(edges) for u, v in zip(path[:-1], path[1:]))
    if not ok:
        raise ValueError(f"a path_star graph is not a G({shape.degree},{shape.path_len}) path-star graph: "
                         f"edges {edges}, source {source}, goal {goal}, path {path}")


def relabel(edges, source: int, goal: int, path, shape: StarGraphShape, rng: Random) -> Example:
    """The same graph with its labels mapped one-to-one onto ``shape.num_nodes`` ids (drawn from ``rng``)."""
    labels = sorted({x for e in edges for x in e})
    ids = dict(zip(labels, rng.sample(range(shape.num_nodes), len(labels))))
    ex = Example(edges=tuple((ids[u], ids[v]) for u, v in edges), source=ids[source], goal=ids[goal],
                 path=tuple(ids[x] for x in path))
    assert is_valid_path(ex, ex.path) and ex.path[-1] == ex.goal
    return ex


def path_star_examples(shape: StarGraphShape, n: int, seed: int = 0, exclude: Optional[set] = None) -> list[Example]:
    """``n`` reasoning-gym path-star graphs of ``shape``, in our labels and layout.

    Graphs whose problem is in ``exclude`` (training keys) are skipped and replaced by further items."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise MutorUserError('--source path_star needs reasoning-gym: pip install -e ".[reasoning-gym]" in the mutor '
                             "checkout (or pip install reasoning-gym)")
    import reasoning_gym

    if shape.num_nodes < shape.nodes_per_graph:
        raise MutorUserError(f"path_star: num_nodes={shape.num_nodes} < {shape.nodes_per_graph} nodes per graph")
    size = n + 64
    items = reasoning_gym.create_dataset("path_star", size=size * 2, seed=seed, degree=shape.degree,
                                         min_path_length=shape.path_len - 1, max_path_length=shape.path_len - 1)
    out: list[Example] = []
    seen = set(exclude or ())
    for i in range(len(items)):
        if len(out) == n:
            break
        edges, source, goal, path = parse_path_star(items[i])
        _check_shape(edges, source, goal, path, shape)
        ex = relabel(edges, source, goal, path, shape, Random(f"path_star/{seed}/{i}"))
        if ex.key in seen:
            continue
        seen.add(ex.key)
        out.append(ex)
    if len(out) < n:
        raise RuntimeError(f"path_star: only {len(out)} of {n} graphs left after excluding training problems")
    return out
