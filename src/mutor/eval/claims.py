"""When a difference between two methods is claimed: one rule for every report mutor writes.

The rule: a paired comparison (each seed trains both methods from the same initialisation, data and batch order,
and scores them on the same held-out examples) over ``n`` seeds is claimed only when its 95 % interval excludes
0. The interval is the t-interval of the mean of the ``n`` per-seed differences (``n - 1`` degrees of freedom),
or, where per-example paired outcomes are available and their interval is wider, the interval that the
examples alone give the same mean. Fewer than three seeds is exploratory: its interval is shown, and it is
never a finding. Every statement of a comparison shows the interval, whether or not it holds.

Why the t-interval over seeds: seed-to-seed variation (initialisation, batch order, which checkpoint a
selection picks) is usually the larger source of noise, and with three seeds the mean has two degrees of
freedom, whose 95 % critical value is 4.30, not 2. Why the per-example interval as a floor: with seeds that
happen to agree, the seed interval can be narrower than the sampling noise of the held-out set itself.

:func:`paired` builds the interval, :func:`reading` says it in words, :func:`format_interval` writes it
with the digits its width supports. ``experiments/evidence/report.py`` and :mod:`mutor.eval.compare`
(``mutor train``'s verdict, ``mutor compare``'s paired differences) use these functions and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["CONFIDENCE", "MIN_SEEDS", "RULE", "Interval", "decimals", "format_interval", "paired", "reading",
           "t_critical", "unpaired_rates"]

CONFIDENCE = 0.95
"""The coverage of every interval a report shows."""

MIN_SEEDS = 3
"""The fewest paired seeds whose comparison can be a finding."""

RULE = ("a paired difference over n seeds is claimed only when n >= 3 and its 95 % t-interval (n - 1 degrees of "
        "freedom; the per-example interval where that is wider) excludes 0; fewer seeds are exploratory")
"""The rule in one sentence, as reports quote it."""


def t_critical(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided critical value of Student's t.

    Args:
        df: Degrees of freedom (at least 1).
        confidence: Coverage of the interval, e.g. 0.95.

    Returns:
        The ``(1 + confidence) / 2`` quantile of t with ``df`` degrees of freedom (4.303 for df = 2 at 95 %).
    """
    from scipy.stats import t

    return float(t.ppf((1 + confidence) / 2, df))


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan"))


@dataclass(frozen=True)
class Interval:
    """A mean paired difference with its 95 % interval, and what the rule makes of it.

    Attributes:
        mean: The mean over seeds of the per-seed mean differences.
        low: Lower end of the interval shown.
        high: Upper end of the interval shown.
        seeds: Number of paired seeds.
        examples: Number of paired examples over all seeds (0 when only per-seed values were given).
        source: Which interval is shown: ``"seeds"`` (the t-interval over seeds), ``"examples"`` (the
            per-example one, wider or the only one) or ``""`` (neither exists: one seed without examples).
        seed_half: Half-width of the t-interval over seeds (NaN below two seeds).
        example_half: Half-width of the per-example interval (NaN without per-example outcomes).
    """

    mean: float
    low: float
    high: float
    seeds: int
    examples: int = 0
    source: str = ""
    seed_half: float = float("nan")
    example_half: float = float("nan")

    @property
    def half(self) -> float:
        """Half-width of the interval shown (NaN when there is none)."""
        return (self.high - self.low) / 2

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval shown lies entirely on one side of 0."""
        return self.low > 0 or self.high < 0

    @property
    def exploratory(self) -> bool:
        """Fewer than :data:`MIN_SEEDS` seeds: shown, never a finding."""
        return self.seeds < MIN_SEEDS

    @property
    def holds(self) -> bool:
        """Whether the rule claims the difference: enough seeds and an interval that excludes 0."""
        return not self.exploratory and self.excludes_zero


def paired(per_seed: Optional[Sequence[float]] = None, per_example: Optional[Sequence[Sequence[float]]] = None,
           confidence: float = CONFIDENCE) -> Interval:
    """The interval of a paired comparison over seeds, by the rule.

    Args:
        per_seed: Each seed's mean difference (run minus baseline). Computed from ``per_example`` when omitted.
        per_example: For each seed, the per-example differences on the same held-out examples (optional).
        confidence: Coverage of the intervals.

    Returns:
        An :class:`Interval` centred on the mean of the per-seed means. Its ends are those of the t-interval
        over seeds (``n - 1`` degrees of freedom, from two seeds on) or of the per-example interval, whichever
        is wider. The per-example interval has the standard error of a mean of per-seed means,
        ``sqrt(sum(s_i**2 / m_i)) / n`` (``s_i`` the s.d. of seed ``i``'s ``m_i`` differences), with
        ``sum(m_i - 1)`` degrees of freedom.

    Raises:
        ValueError: When neither argument holds a value, or both are given with different numbers of seeds.
    """
    if per_seed is None:
        if not per_example:
            raise ValueError("paired(): give the per-seed differences, the per-example ones, or both")
        per_seed = [sum(d) / len(d) for d in per_example]
    per_seed = [float(x) for x in per_seed]
    if not per_seed:
        raise ValueError("paired(): no seed")
    if per_example is not None and len(per_example) != len(per_seed):
        raise ValueError(f"paired(): {len(per_seed)} per-seed differences but {len(per_example)} seeds of examples")
    n = len(per_seed)
    mean, sd = _mean_sd(per_seed)
    seed_half = t_critical(n - 1, confidence) * sd / math.sqrt(n) if n > 1 else float("nan")
    example_half, examples = float("nan"), 0
    if per_example is not None and all(len(d) > 1 for d in per_example):
        examples = sum(len(d) for d in per_example)
        var = sum(_mean_sd(d)[1] ** 2 / len(d) for d in per_example) / n ** 2
        example_half = t_critical(examples - n, confidence) * math.sqrt(var)
    halves = {k: h for k, h in (("seeds", seed_half), ("examples", example_half)) if not math.isnan(h)}
    if not halves:
        return Interval(mean, float("nan"), float("nan"), n, examples)
    source = max(halves, key=lambda k: (halves[k], k == "examples"))      # a tie shows the per-example one
    half = halves[source]
    return Interval(mean, mean - half, mean + half, n, examples, source, seed_half, example_half)


def unpaired_rates(a: float, b: float, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The interval of ``a - b`` for two rates measured on the same ``n`` held-out examples, one seed each, when
    the per-example outcomes are not at hand (``mutor train``'s final evaluation records only the rates).

    The two runs are treated as independent, which is conservative for paired outcomes (they are positively
    correlated, so their difference varies less); each rate's binomial variance is taken with one success and
    one failure added, ``p = (k + 1) / (n + 2)``, so that a rate of 0 or 1 does not give an interval of width 0.

    Args:
        a: The run's rate, in [0, 1].
        b: The baseline's rate, in [0, 1].
        n: Number of held-out examples each rate was measured on.
        confidence: Coverage of the interval.

    Returns:
        An :class:`Interval` of one seed (exploratory by the rule), ``source`` ``"examples"``.
    """
    var = sum(p * (1 - p) / (n + 2) for p in ((a * n + 1) / (n + 2), (b * n + 1) / (n + 2)))
    half = t_critical(2 * n - 2 if n > 1 else 1, confidence) * math.sqrt(var)
    d = a - b
    return Interval(d, d - half, d + half, 1, n, "examples", float("nan"), half)


def decimals(half: float, default: int = 1) -> int:
    """How many decimals a value with this interval half-width supports: the half-width to two significant
    digits (9.5 -> 1 decimal, 12 -> 0, 0.0027 -> 4).

    Args:
        half: Half-width of the value's interval.
        default: Decimals when the half-width is 0 or undefined.

    Returns:
        The number of decimals, at least 0.
    """
    if not half or math.isnan(half) or math.isinf(half):
        return default
    return max(0, 1 - math.floor(math.log10(abs(half))))


def format_interval(iv: Interval, digits: Optional[int] = None, scale: float = 1.0) -> str:
    """``-9.7 [-19.2, -0.1]``: the mean and the interval shown, with the digits the interval's width supports.

    A bound that is not 0 never reads as 0: every number gets the further decimals (up to 6) that show its sign
    (``-11.56 [-23.16, +0.05]``, not ``-12 [-23, +0]``), since the sign is what the claim rule reads.

    Args:
        iv: The interval.
        digits: Decimals to use instead of :func:`decimals` of the half-width.
        scale: Factor applied to every number (e.g. 100 for a rate written in points).

    Returns:
        The mean with its interval in brackets, or the mean and ``[no interval]`` when there is none.
    """
    d = decimals(iv.half * scale) if digits is None else digits
    if math.isnan(iv.low):
        return f"{iv.mean * scale:+.{d}f} [no interval]"
    while d < 6 and any(b != 0 and round(b * scale, d) == 0 for b in (iv.low, iv.high)):
        d += 1
    return f"{iv.mean * scale:+.{d}f} [{iv.low * scale:+.{d}f}, {iv.high * scale:+.{d}f}]"


def reading(iv: Interval, higher_is_better: Optional[bool] = True, than: str = "next-token") -> str:
    """The rule's reading of a comparison in words.

    Args:
        iv: The comparison's interval.
        higher_is_better: Whether a positive difference favours the run (False for a loss; None when the
            measure has no direction: the reading then says higher or lower).
        than: The baseline's name in the sentence.

    Returns:
        ``"better than X"`` or ``"worse than X"`` (``"higher"`` / ``"lower"`` without a direction) when the rule
        claims the difference, ``"not shown"`` when the interval includes 0, ``"exploratory (k seeds)"`` below
        :data:`MIN_SEEDS` seeds.
    """
    if iv.exploratory:
        return f"exploratory ({iv.seeds} seed{'s' if iv.seeds != 1 else ''})"
    if not iv.holds:
        return "not shown"
    if higher_is_better is None:
        return ("higher" if iv.mean > 0 else "lower") + f" than {than}"
    better = (iv.mean > 0) == higher_is_better
    return ("better" if better else "worse") + f" than {than}"
