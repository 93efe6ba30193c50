"""The claim rule (mutor.eval.claims) against t-intervals computed by hand: a paired difference over n seeds is
claimed only with three seeds or more and a 95 % interval (n - 1 degrees of freedom; the per-example interval
where wider) that excludes 0; fewer seeds are exploratory; every comparison is shown with its interval.

The critical values are written out (Student's t, two-sided 95 %): t(1) = 12.7062, t(2) = 4.3027, t(3) = 3.1824,
t(14) = 2.1448."""

from __future__ import annotations

import math

import pytest

from mutor.eval.claims import MIN_SEEDS, decimals, format_interval, paired, reading, t_critical, unpaired_rates
from mutor.eval.compare import comparison_markdown, verdict

T1, T2, T3, T14 = 12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.144786687917804


def test_critical_values_are_students_t():
    assert [t_critical(df) for df in (1, 2, 3, 14)] == pytest.approx([T1, T2, T3, T14], rel=1e-9)
    assert t_critical(10_000) == pytest.approx(1.960, abs=1e-3)


def test_three_seeds_whose_interval_includes_0_are_not_shown():
    iv = paired([1.0, 2.0, 3.0])                       # mean 2, s.d. 1: 2 ± 4.3027 / sqrt(3)
    half = T2 * 1.0 / math.sqrt(3)
    assert (iv.mean, iv.low, iv.high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert iv.seeds == 3 and iv.source == "seeds" and not iv.exploratory
    assert not iv.excludes_zero and not iv.holds and reading(iv) == "not shown"
    assert format_interval(iv) == "+2.0 [-0.5, +4.5]"


def test_three_seeds_whose_interval_excludes_0_are_claimed_with_their_direction():
    iv = paired([4.0, 5.0, 6.0])                       # 5 ± 2.484: [2.516, 7.484]
    assert (iv.low, iv.high) == pytest.approx((5 - T2 / math.sqrt(3), 5 + T2 / math.sqrt(3)))
    assert iv.holds and reading(iv) == "better than next-token"
    assert reading(iv, higher_is_better=False) == "worse than next-token"       # a loss that went up
    assert reading(iv, None, "b") == "higher than b"
    neg = paired([-4.0, -5.0, -6.0])
    assert neg.holds and reading(neg) == "worse than next-token" and reading(neg, False) == "better than next-token"


def test_the_word_reversal_reading_of_three_seeds_just_holds_at_95_percent():
    """-8.3, -6.7, -14.0 points: mean -9.7, s.e. 2.22, t = 4.36 > 4.30: the interval ends just below 0."""
    iv = paired([-25 / 3, -20 / 3, -14.0])
    se = math.sqrt(sum((x - iv.mean) ** 2 for x in (-25 / 3, -20 / 3, -14.0)) / 2 / 3)
    assert iv.half == pytest.approx(T2 * se) and iv.high < 0 and iv.holds
    assert format_interval(iv) == "-9.7 [-19.2, -0.1]"
    assert abs(iv.mean) / se == pytest.approx(4.36, abs=0.01)


def test_a_bound_near_0_keeps_the_decimals_that_show_its_sign():
    """-13.0, -15.3, -6.3 points: the interval ends 0.05 above 0, which the width's own digits would write "+0"."""
    iv = paired([-13.0, -46 / 3, -19 / 3])
    assert 0 < iv.high < 0.1 and not iv.holds and reading(iv) == "not shown"
    assert format_interval(iv) == "-11.56 [-23.16, +0.05]"                    # every number to the same decimals
    assert format_interval(iv, digits=0) == "-11.56 [-23.16, +0.05]"


def test_two_seeds_are_exploratory_however_far_from_0():
    iv = paired([10.0, 11.0])                          # 10.5 ± 12.706 * 0.5: [4.147, 16.853]
    assert (iv.low, iv.high) == pytest.approx((10.5 - T1 * 0.5, 10.5 + T1 * 0.5))
    assert iv.excludes_zero and iv.exploratory and not iv.holds and MIN_SEEDS == 3
    assert reading(iv) == "exploratory (2 seeds)"
    one = paired([3.0])                                # one seed, no examples: no interval at all
    assert math.isnan(one.low) and one.source == "" and reading(one) == "exploratory (1 seed)"
    assert format_interval(one) == "+3.0 [no interval]"


def test_the_per_example_interval_is_shown_where_it_is_wider_than_the_seeds():
    """Three seeds that agree exactly (seed interval of width 0) but whose examples are noisy: each seed's
    differences are [0, 2] (mean 1, s.d. sqrt(2)); s.e. of the mean of means sqrt(3 * 2 / 2) / 3 = sqrt(1/3),
    with 3 degrees of freedom: 1 ± 3.1824 * 0.5774 = [-0.837, 2.837], not shown."""
    iv = paired(per_example=[[0.0, 2.0]] * 3)
    assert iv.seed_half == 0.0 and iv.source == "examples" and iv.examples == 6
    assert iv.half == pytest.approx(T3 * math.sqrt(1 / 3))
    assert (iv.low, iv.high) == pytest.approx((1 - 1.8373862310370785, 1 + 1.8373862310370785))
    assert not iv.holds and reading(iv) == "not shown"
    wide_seeds = paired(per_example=[[0.0, 0.0], [5.0, 5.0], [10.0, 10.0]])     # no spread within a seed
    assert wide_seeds.source == "seeds" and wide_seeds.example_half == 0.0


def test_one_seed_with_examples_gets_the_per_example_interval_and_stays_exploratory():
    iv = paired(per_example=[[2.0, 1.0, 2.0, 1.0]])   # mean 1.5, s.d. sqrt(1/3), 4 examples, 3 d.f.
    assert iv.source == "examples" and iv.half == pytest.approx(T3 * math.sqrt(1 / 3) / 2)
    assert iv.excludes_zero and not iv.holds and reading(iv) == "exploratory (1 seed)"


def test_paired_refuses_nothing_or_mismatched_seeds():
    with pytest.raises(ValueError):
        paired()
    with pytest.raises(ValueError):
        paired([1.0, 2.0], [[1.0, 1.0]])


def test_two_rates_on_the_same_examples_without_their_outcomes():
    """0.5 against 0.25 on 8 examples: p = (k + 1) / (n + 2) = 0.5 and 0.3; variance 0.25 / 10 + 0.21 / 10 =
    0.046; 0.25 ± 2.1448 * sqrt(0.046) = 0.25 ± 0.460."""
    iv = unpaired_rates(0.5, 0.25, 8)
    assert iv.half == pytest.approx(0.46000549680062897) and iv.mean == pytest.approx(0.25)
    assert iv.seeds == 1 and iv.exploratory and not iv.excludes_zero
    assert unpaired_rates(0.0, 0.0, 16).half > 0                              # never a width of 0


def test_figures_carry_the_digits_their_interval_supports():
    assert [decimals(h) for h in (9.5, 12.0, 0.0027, 0.56, 1.4, 0.0)] == [1, 0, 4, 2, 1, 1]
    iv = paired([-0.0603, -0.0667, -0.0606])
    assert format_interval(iv) == "-0.0625 [-0.0715, -0.0536]"
    assert format_interval(paired([1.0, 2.0, 3.0]), scale=100) == "+200 [-48, +448]"


def _run(method: str, rate: float, n: int = 16, seed: int = 0) -> dict:
    return {"method": method, "seed": seed, "primary_metric": "solve_rate", "global_step": 6, "train_loss": 1.0,
            "wall_seconds": 1.0, "eval_history": [{"eval_step": 6, "eval_solve_rate": rate, "eval_num_eval": n}]}


def test_mutor_train_verdict_says_one_seed_is_exploratory_and_shows_the_interval():
    within = verdict([_run("next_token", 0.5), _run("mutor", 0.5625)])
    iv = unpaired_rates(0.5625, 0.5, 16)
    assert within == (f"mutor minus next_token solve_rate: {format_interval(iv)} (95 % interval on 16 held-out "
                      "examples): within noise. One seed (0): exploratory, not a finding; a claim needs three seeds "
                      "or more whose 95 % interval excludes 0.")
    far = verdict([_run("next_token", 0.1, 400), _run("mutor", 0.9, 400)])
    assert "mutor is higher in this run. One seed (0): exploratory, not a finding" in far
    assert verdict([_run("mutor", 0.5)]) == ""                                   # no baseline
    assert verdict([_run("next_token", 3.0), _run("mutor", 2.0)]) == ""        # not rates: no interval of two rates
    md = comparison_markdown([_run("next_token", 0.5), _run("mutor", 0.5625)])
    assert md.rstrip().endswith("whose 95 % interval excludes 0.")
