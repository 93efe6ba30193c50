"""Path-star graph problems, whatever their rendering: the shape, the graphs drawn, the splits and the scores.

A source node has ``degree`` arms of ``path_len - 1`` nodes each; an :class:`Example` is one graph, its
source, its goal (the last node of one arm) and the answer path. The task renders them as one token per node
(:mod:`mutor.data.star_graph`, which also holds the task) or as text for a pretrained model's tokenizer
(:mod:`mutor.data.star_graph_text`); both import this module and neither imports the other's rendering at
module level. What is unusual: the test graphs are drawn first, from their own seed, and no training graph
shares a problem (edge set, source, goal) with them (:func:`split_examples`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["ANSWER_SEP", "EDGE_SEP", "NUM_SPECIAL", "PAD", "QUERY_SEP", "Example", "StarGraphShape",
           "is_valid_path", "make_examples", "path_scores", "sample_example", "split_examples"]

PAD, EDGE_SEP, QUERY_SEP, ANSWER_SEP = 0, 1, 2, 3
NUM_SPECIAL = 4


@dataclass(frozen=True)
class StarGraphShape:
    """Path-star graphs: ``degree`` arms of ``path_len - 1`` nodes from one source.

    ``path_len`` is the number of nodes on the answer path, source and goal included.
    Node labels are drawn without replacement from ``num_nodes`` labels per example.
    """

    degree: int = 2
    path_len: int = 5
    num_nodes: int = 50

    def __post_init__(self) -> None:
        if self.degree < 2:
            raise ValueError(f"degree must be >= 2 (got {self.degree})")
        if self.path_len < 3:
            raise ValueError(f"path_len must be >= 3 (got {self.path_len})")
        if self.num_nodes < self.nodes_per_graph:
            raise ValueError(f"num_nodes={self.num_nodes} < {self.nodes_per_graph} nodes per graph "
                             f"(degree * (path_len - 1) + 1)")

    @classmethod
    def from_options(cls, options: dict) -> "StarGraphShape":
        """The shape a ``star_graph`` task's options give (defaults: ``degree`` 2, ``path_len`` 5, ``num_nodes`` 50)."""
        return cls(degree=int(options.get("degree", 2)), path_len=int(options.get("path_len", 5)),
                   num_nodes=int(options.get("num_nodes", 50)))

    @property
    def nodes_per_graph(self) -> int:
        """Nodes in one graph: the source plus ``degree`` arms of ``path_len - 1`` nodes."""
        return self.degree * (self.path_len - 1) + 1

    @property
    def num_edges(self) -> int:
        """Edges in one graph (each arm is a chain from the source)."""
        return self.degree * (self.path_len - 1)

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary: the special tokens, then one per node label."""
        return NUM_SPECIAL + self.num_nodes

    @property
    def prompt_len(self) -> int:
        """Tokens in a prompt: the edges joined by ``|``, then ``/``, source, goal and ``=``."""
        return 3 * self.num_edges - 1 + 1 + 3        # edges joined by '|', then '/', s, g, '='

    @property
    def seq_len(self) -> int:
        """Tokens in a whole example: the prompt and the ``path_len`` nodes of the answer path."""
        return self.prompt_len + self.path_len


@dataclass(frozen=True)
class Example:
    """One graph. Node ids are labels in ``[0, num_nodes)``; tokens are ``NUM_SPECIAL + id``."""

    edges: tuple[tuple[int, int], ...]   # in prompt order
    source: int
    goal: int
    path: tuple[int, ...]                # source, a1, ..., goal

    @property
    def key(self) -> tuple:
        """Identity of the problem regardless of the order the edges are listed in."""
        return (tuple(sorted(self.edges)), self.source, self.goal)

    def prompt_ids(self) -> list[int]:
        """The prompt's token ids: the edges in prompt order, then the query (source, goal) and ``=``."""
        ids: list[int] = []
        for i, (u, v) in enumerate(self.edges):
            if i:
                ids.append(EDGE_SEP)
            ids += [NUM_SPECIAL + u, NUM_SPECIAL + v]
        return ids + [QUERY_SEP, NUM_SPECIAL + self.source, NUM_SPECIAL + self.goal, ANSWER_SEP]

    def answer_ids(self) -> list[int]:
        """The answer's token ids: the path from source to goal."""
        return [NUM_SPECIAL + n for n in self.path]

    def text(self) -> str:
        """The example as text, e.g. ``3,5|1,2|5,7|3,1/3,7=3,5,7``: edges, source and goal, then the path."""
        edges = "|".join(f"{u},{v}" for u, v in self.edges)
        return f"{edges}/{self.source},{self.goal}=" + ",".join(str(n) for n in self.path)


def sample_example(shape: StarGraphShape, rng: random.Random) -> Example:
    """Draw one graph of ``shape``: random node labels, edges in random order, and a random arm as the goal."""
    nodes = rng.sample(range(shape.num_nodes), shape.nodes_per_graph)
    source, rest = nodes[0], nodes[1:]
    arms = [rest[i * (shape.path_len - 1):(i + 1) * (shape.path_len - 1)] for i in range(shape.degree)]
    edges = []
    for arm in arms:
        chain = [source] + arm
        edges += list(zip(chain[:-1], chain[1:]))
    rng.shuffle(edges)
    arm = arms[rng.randrange(shape.degree)]
    return Example(edges=tuple(edges), source=source, goal=arm[-1], path=(source, *arm))


def make_examples(shape: StarGraphShape, n: int, seed: int, exclude: Optional[set] = None) -> list[Example]:
    """``n`` distinct examples, deterministic in ``seed``; none whose :attr:`Example.key` is in ``exclude``."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out: list[Example] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 20 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct star graphs of {shape}; increase num_nodes")
        ex = sample_example(shape, rng)
        if ex.key in seen:
            continue
        seen.add(ex.key)
        out.append(ex)
    return out


def split_examples(shape: StarGraphShape, num_train: int, num_test: int,
                   seed: int) -> tuple[list[Example], list[Example]]:
    """A held-out test set, then a training set that shares no problem with it (separate seeds)."""
    test = make_examples(shape, num_test, seed=2 * seed + 1)
    train = make_examples(shape, num_train, seed=2 * seed, exclude={ex.key for ex in test})
    return train, test


def is_valid_path(ex: Example, path: Sequence[int]) -> bool:
    """True when ``path`` starts at the source and follows listed edges all the way (any arm)."""
    if len(path) != len(ex.path) or path[0] != ex.source:
        return False
    edges = set(ex.edges)
    return all((u, v) in edges for u, v in zip(path[:-1], path[1:]))


def path_scores(ex: Example, path: tuple) -> dict:
    """0/1 per example: the exact path, the first hop, a valid path (the metrics of both renderings' ``evaluate``)."""
    return {"solve_rate": int(path == ex.path), "first_hop": int(len(path) > 1 and path[1] == ex.path[1]),
            "valid_path": int(is_valid_path(ex, path))}
