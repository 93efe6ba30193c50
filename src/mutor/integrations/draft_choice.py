"""What a drafting round feeds, chosen from measured costs and acceptance; and the counts of a decoding run.

Pure bookkeeping, no tensors: :class:`DraftLength` is the draft chooser of ``generate(...,
draft_registers="auto")`` (``speculative.py``), :class:`DraftStats` what ``generate`` reports. The chooser
is an expected-rate model: tokens a round yields on average (from the recent acceptance per offset) over the
seconds a forward of that many rows has been measured to cost on this machine, so that the same registers
draft long on a GPU or in bf16 and little or nothing in float32 on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class DraftStats:
    """Counts of one decoding run: ``offered[d]`` drafts for ``x_{e+d}`` reached verification, ``accepted[d]`` kept."""

    forwards: int = 0
    new_tokens: int = 0
    offered: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)          # forwards per draft length K (K = 1: no draft)
    tail_rounds: int = 0                                          # of them, rounds with registers after the last token only

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forwards, 1)

    def acceptance(self) -> dict[int, float]:
        """Per offset d: accepted / offered (a draft is offered only when every earlier draft was kept)."""
        return {d: self.accepted.get(d, 0) / n for d, n in sorted(self.offered.items()) if n}

    def add(self, other: "DraftStats") -> "DraftStats":
        """Accumulate another run's counts into this one (returns self)."""
        self.forwards += other.forwards
        self.new_tokens += other.new_tokens
        for d, n in other.offered.items():
            self.offered[d] = self.offered.get(d, 0) + n
            self.accepted[d] = self.accepted.get(d, 0) + other.accepted.get(d, 0)
        for k, n in other.rounds.items():
            self.rounds[k] = self.rounds.get(k, 0) + n
        self.tail_rounds += other.tail_rounds
        return self

    def to_dict(self) -> dict:
        return {"forwards": self.forwards, "new_tokens": self.new_tokens,
                "tokens_per_forward": round(self.tokens_per_forward, 4),
                "acceptance": {f"d={d}": round(a, 4) for d, a in self.acceptance().items()},
                "offered": {f"d={d}": n for d, n in sorted(self.offered.items())},
                "rounds": {f"K={k}": n for k, n in sorted(self.rounds.items())}, "tail_rounds": self.tail_rounds}


class DraftLength:
    """Chooses each round's draft from the recent acceptance and the measured cost of a forward: its length
    K in 1..K_max, and whether the registers follow every fed token or only the last one.

    A round feeds the pending token and up to K-1 drafted tokens. With registers after each of them
    ("full", K^2 rows) the round after always has a draft; it yields ``E(K) = 1 + sum_{j=2..K} prod_{d=2..j}
    p_d`` tokens on average, ``p_d`` being the acceptance of offset d given that every earlier draft was kept.
    With registers after the last token only ("tail", 2K-1 rows) a rejected draft leaves the next round
    without one (it feeds one token and K-1 registers, K rows, for one token), so a tail round and its
    share of draftless rounds yield ``E(K) + 1 - P(K)`` tokens for ``c(2K-1) + (1 - P(K)) c(K)``, ``P(K)``
    being the chance that the whole draft is kept. ``p_d`` is estimated from recent drafts (an offset's counts
    discounted by ``memory`` each time it is offered, one kept and one rejected draft as prior), so that a
    repetitive or formulaic stretch of text is noticed; an offset not offered keeps its estimate (the probes
    below try it again), so that rounds of plain decoding do not pull a poor drafter back to the prior.
    ``c(rows)`` is a running average of the measured seconds of a forward with that many rows, capped
    by what any larger measured one costs (a count not yet measured too), or, above every measured one, in
    proportion to the largest (a full round may never be fed whole: answers end, drafts end at eos).

    Each round takes the draft with the most tokens per second. Which one wins depends on the machine, not
    only on the registers: where extra rows cost nearly nothing (bf16 on a CPU with AVX512-BF16, a GPU),
    long full drafts; where matrix products cost in steps of rows (float32 on a CPU: 1-3 rows cost about
    one, 4-6 about two), short tail drafts; where rows cost in proportion, or the registers are poor, K = 1,
    which is plain greedy decoding. Every candidate is tried once at the start (most rows first). While
    K = 1 wins, the cheapest draft (K = 2, tail) is tried again after ``probe`` rounds (two rounds: one
    drafts, the next verifies), an interval that doubles (up to ``max_probe``) each time the probe does not
    change the choice, so that a poor drafter costs a vanishing share of forwards.
    ``fixed``: always that K, full (no timing)."""

    def __init__(self, k_max: int, fixed: Optional[int] = None, probe: int = 4, max_probe: int = 64,
                 memory: float = 0.85, smoothing: float = 0.3):
        self.k_max, self.fixed, self.memory, self.smoothing = k_max, fixed, memory, smoothing
        self.probe, self.min_probe, self.max_probe = probe, probe, max_probe
        self.cost: dict[int, float] = {}                   # seconds per forward, by its number of rows
        self.offered = [0.0] * (k_max + 1)                 # discounted counts per offset d (index d)
        self.accepted = [0.0] * (k_max + 1)
        self.since_probe, self.verifying = 0, False
        self.candidates = [(1, False)] + [(k, tail) for k in range(2, k_max + 1) for tail in (False, True)]
        self.tried: set[tuple[int, bool]] = set()

    @staticmethod
    def rows(k: int, tail: bool) -> int:
        """Rows of a round that feeds the pending token, a full draft of k-1 tokens and its registers."""
        return 2 * k - 1 if tail else k * k

    def expected_tokens(self, k: int) -> float:
        return self._chain(k)[0]

    def _chain(self, k: int) -> tuple[float, float]:
        """``(E(k), P(k))``: expected tokens of a round with a draft of k-1 tokens, chance all are kept."""
        total, run = 1.0, 1.0
        for d in range(2, k + 1):
            run *= (self.accepted[d] + 1) / (self.offered[d] + 2)
            total += run
        return total, run

    def seconds(self, rows: int) -> Optional[float]:
        """The cost of a forward of ``rows`` rows: the least measured cost at that many rows or more (fewer rows
        never cost more, so one slow measurement of a short forward cannot lock it out), else the largest
        measured one's in proportion (None: nothing measured)."""
        above = [c for r, c in self.cost.items() if r >= rows]
        if above:
            return min(above)
        return max(self.cost.items())[1] * rows / max(self.cost) if self.cost else None

    def rate(self, k: int, tail: bool) -> Optional[float]:
        """Expected tokens per second of the candidate (None: not timed yet)."""
        c = self.seconds(self.rows(k, tail))
        if c is None:
            return None
        e, p = self._chain(k)
        if not tail:
            return e / c
        return (e + 1 - p) / (c + (1 - p) * self.seconds(k))

    def best(self) -> tuple[int, bool]:
        return max(self.candidates, key=lambda c: self.rate(*c))

    def choose(self) -> tuple[int, bool]:
        """This round's ``(K, tail)``."""
        if self.fixed is not None:
            return self.fixed, False
        untried = sorted((c for c in self.candidates if c not in self.tried), key=lambda c: -self.rows(*c))
        if untried:
            self.tried.add(untried[0])
            return untried[0]
        k, tail = self.best()
        if k > 1:
            self.since_probe, self.probe = 0, self.min_probe
            return k, tail
        if self.k_max < 2:
            return 1, False
        probe = (2, True)                                  # the cheapest draft; longer ones need d = 2 kept first
        if self.verifying:                                 # the probe's draft is verified in the next round
            self.verifying = False
            return probe
        self.since_probe += 1
        if self.since_probe >= self.probe:                 # probe; back off if it changes nothing
            self.since_probe, self.probe, self.verifying = 0, min(2 * self.probe, self.max_probe), True
            return probe
        return 1, False

    def observe(self, drafted: int, kept: int) -> None:
        """One verification: ``drafted`` drafts were fed, the first ``kept`` of them equal greedy's tokens."""
        for d in range(2, min(drafted, kept + 1) + 2):     # offered: every draft up to the first mismatch
            self.offered[d] = self.memory * self.offered[d] + 1
            self.accepted[d] = self.memory * self.accepted[d] + (d - 2 < kept)

    def record(self, rows: int, seconds: float) -> None:
        """The measured seconds of a forward of ``rows`` rows (tokens and registers)."""
        old = self.cost.get(rows)
        self.cost[rows] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds
