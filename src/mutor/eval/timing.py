"""How decoders are timed against each other: the order they take turns in, and an interval for their ratio.

Decoders measured in one process take turns on each prompt, so that a change of the machine's speed hits them
alike. The order matters too: a decoder that always follows the same one always meets its leftovers (a cache,
memory just freed), so the orders here come from a Williams design, in which each decoder follows every other
equally often. A speed ratio of two decoders over the same prompts gets a bootstrap interval over the prompts:
prompts differ in length far more than the decoders do, and resampling them with the same draws for both keeps
the pairing. Used by ``experiments/evidence/drafting.py``, ``benchmarks/chooser_ab.py`` and
``benchmarks/pool_drafting.py``.
"""

from __future__ import annotations

import random

__all__ = ["bootstrap_ratio", "williams_orders"]


def williams_orders(n: int) -> list[list[int]]:
    """Orders of n decoders in which each one follows every other equally often (a Williams design: one Latin
    square for even n, it and its mirror for odd n), and takes each place equally often."""
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]       # 0, 1, n-1, 2, n-2, ...
    square = [[(x + i) % n for x in first] for i in range(n)]
    return square if n % 2 == 0 else square + [row[::-1] for row in square]


def bootstrap_ratio(base: list[float], other: list[float], draws: int = 2000, seed: int = 0) -> list[float]:
    """95 % interval of sum(base) / sum(other) over prompts drawn with replacement (the same draws for both)."""
    rng, n = random.Random(seed), len(base)
    ratios = sorted(sum(base[i] for i in idx) / sum(other[i] for i in idx)
                    for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(draws)))
    return [round(ratios[int(0.025 * draws)], 3), round(ratios[int(0.975 * draws) - 1], 3)]
