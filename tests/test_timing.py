"""mutor.eval.timing: the orders decoders take turns in (each after every other, in every place, equally often)
and the bootstrap interval of a ratio of their seconds."""

from __future__ import annotations

import pytest

from mutor.eval.timing import bootstrap_ratio, williams_orders


@pytest.mark.parametrize("n", [2, 3, 5, 6])
def test_orders_put_each_decoder_after_every_other_and_in_every_place_equally_often(n):
    orders = williams_orders(n)
    assert all(sorted(o) == list(range(n)) for o in orders)
    follows = [(o[i], o[i + 1]) for o in orders for i in range(n - 1)]
    assert sorted(set(follows)) == [(a, b) for a in range(n) for b in range(n) if a != b]
    assert len(set(follows.count(p) for p in follows)) == 1
    places = [(x, i) for o in orders for i, x in enumerate(o)]
    assert len(set(places)) == n * n and len(set(places.count(p) for p in places)) == 1


def test_bootstrap_interval_holds_the_ratio_of_totals_and_is_a_point_when_every_prompt_agrees():
    assert bootstrap_ratio([2.0] * 5, [1.0] * 5) == [2.0, 2.0]
    lo, hi = bootstrap_ratio([1.0, 2.0, 1.5, 1.2, 0.9], [1.0, 1.1, 1.0, 1.3, 1.0])
    assert lo < 6.6 / 5.4 < hi
