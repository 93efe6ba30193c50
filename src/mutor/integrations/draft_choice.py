"""What a drafting round feeds, chosen from measured costs and acceptance; and the counts of a decoding run.

Pure bookkeeping, no tensors: :class:`DraftLength` is the draft chooser of ``generate(...,
draft_registers="auto")`` (``speculative.py``), :class:`DraftStats` what ``generate`` reports. The chooser
is an expected-rate model: tokens a round yields on average (from the recent acceptance per offset) over the
seconds a forward of that many rows has been measured to cost on this machine, so that the same registers
draft long on a GPU or in bf16 and little or nothing in float32 on a CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional


def _running_mean(old: float, x: float, n: int, floor: float) -> float:
    """``old`` moved toward ``x``, the ``n``-th value: the mean of the first ``1/floor`` values, then a running
    average of weight ``floor``."""
    w = max(1 / n, floor)
    return (1 - w) * old + w * x


@dataclass
class DraftStats:
    """Counts of one decoding run of :func:`mutor.generate` (or several, summed with :meth:`add`).

    A round is one forward; the draft of a round proposes ``x_{e+d}`` for d = 2..K after the newest kept token
    ``x_e``. A draft for offset d reaches verification only when every earlier draft of its round was kept.

    Attributes:
        forwards: Forwards of the model (the prompt's included).
        new_tokens: Tokens generated.
        offered: Per offset d, drafts for ``x_{e+d}`` that reached verification.
        accepted: Per offset d, of those, drafts kept (equal to the model's own choice, or accepted by
            speculative sampling).
        rounds: Forwards per draft length K (K = 1: no draft fed).
        tail_rounds: Of the rounds, those with registers after the last fed token only.
    """

    forwards: int = 0
    new_tokens: int = 0
    offered: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)
    tail_rounds: int = 0

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per forward (0 before any forward)."""
        return self.new_tokens / max(self.forwards, 1)

    def acceptance(self) -> dict[int, float]:
        """The acceptance per offset.

        Returns:
            ``{d: accepted / offered}`` for every offset with a draft offered (a draft is offered only when
            every earlier draft of its round was kept), by increasing d.
        """
        return {d: self.accepted.get(d, 0) / n for d, n in sorted(self.offered.items()) if n}

    def add(self, other: "DraftStats") -> "DraftStats":
        """Accumulate another run's counts into this one.

        Args:
            other: The counts to add.

        Returns:
            This object, with ``other``'s counts added.
        """
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
        """A JSON-ready summary.

        Returns:
            ``forwards``, ``new_tokens``, ``tokens_per_forward``, ``acceptance`` and ``offered`` by ``"d=<d>"``,
            ``rounds`` by ``"K=<K>"`` and ``tail_rounds``.
        """
        return {"forwards": self.forwards, "new_tokens": self.new_tokens,
                "tokens_per_forward": round(self.tokens_per_forward, 4),
                "acceptance": {f"d={d}": round(a, 4) for d, a in self.acceptance().items()},
                "offered": {f"d={d}": n for d, n in sorted(self.offered.items())},
                "rounds": {f"K={k}": n for k, n in sorted(self.rounds.items())}, "tail_rounds": self.tail_rounds}


class DraftLength:
    """Chooses each round's draft from the recent acceptance and the measured cost of a forward: its length
    K in 1..K_max, and whether the registers follow every fed token or only the last one.

    The model. A round feeds the pending token and up to K-1 drafted tokens. With registers after each of them
    ("full", K^2 rows) the round after always has a draft; it yields ``E(K) = 1 + sum_{j=2..K} prod_{d=2..j}
    p_d`` tokens on average, ``p_d`` being the acceptance of offset d given that every earlier draft was kept.
    With registers after the last token only ("tail", 2K-1 rows) a rejected draft leaves the next round
    without one (it feeds one token and K-1 registers, K rows, for one token), so a tail round and its
    share of draftless rounds yield ``E(K) + 1 - P(K)`` tokens for ``c(2K-1) + (1 - P(K)) c(K)``, ``P(K)``
    being the chance that the whole draft is kept. Each round takes the candidate with the most tokens per
    second, and plain decoding (K = 1) unless a draft beats it by ``margin``. So the same registers draft long
    where extra rows cost little (bf16 on a CPU with AVX512-BF16, a GPU) and little or nothing where a forward
    of a few rows costs two or three of one row (float32 on a CPU).

    What it learns, and how it guards against its own errors:

    - ``p_d``: kept over offered drafts, discounted by ``memory`` each time the offset is offered, one kept and
      one rejected draft as prior, 0 until checked once. Every draft the registers make, fed or not, is checked
      against the tokens decoded after it (:meth:`watch`, :meth:`emitted`), so acceptance costs no rows; only what
      could be fed counts (a right guess of the end saves nothing). The prompt's registers' drafts (an answer's
      first tokens) keep their own acceptance and decide the round after the prompt's (:meth:`choose`). For the
      choice each in-answer ``p_d`` is taken ``optimism`` standard errors high: a plain round observes nothing,
      so an estimate too low would never be corrected, while one too high is corrected by the rounds it causes.
    - ``c(rows)``: the average of a forward's measured seconds by its rows (the mean of the first
      ``1/smoothing``, then weight ``smoothing``), at a speed level shared by every row count. A count fed
      rarely would otherwise keep the speed of when it was fed, and the chooser would draft whenever the plain
      forwards had just slowed (a winner's curse on costs). How fast the level follows is chosen from the data:
      levels following at the speeds ``level_gains`` each predict every forward, and the one with the least
      recent squared relative error is used (the slowest, folded into the averages, until 20 forwards; ``()``:
      no level). A measurement counts at half to twice a prediction at most (a spike is not a new speed). A count
      not measured costs what the cheapest larger measured one does, or above every measured one the largest in
      proportion; costs are not assumed to grow with the rows (in float32 on a CPU 4 rows can cost less than 3).
    - Trying a draft: one not tried yet is tried when it would win at the least it may cost (the most a measured
      forward with fewer rows costs), fewest rows first, so that one slow forward rules out every larger draft
      the acceptance cannot pay for; a round first drafts every offset where the draft is too short for it.
    - Probes: while a draft shorter than K_max wins (K = 1 included), a round adds registers for every offset
      after its last fed token every ``probe`` rounds, an interval that doubles (up to ``max_probe``) while the
      choice stays and never lets the probes' rows take more than ``probe_share`` of the time; where not even a
      draft kept whole could pay, no register is fed at all.
    - The answer's ends: where a draft wins, the prompt's registers reach one offset beyond the winning draft,
      and where only in-answer drafting wins they are fed only where their own draft pays for its rows
      (:meth:`prompt_round`); a round with no draft to feed takes the cheapest count of registers, and a draft
      that reaches the answer's end is priced by the rows its round feeds (:meth:`last_round`).

    Pass one instance to :func:`mutor.generate` for every prompt of an evaluation: what it has learned carries
    over, so short answers do not each pay for timing every draft length.

    Args:
        k_max: The longest draft length K (the pending token and K-1 drafted ones), at most the model's
            ``d_max``.
        fixed: Always this K, with registers after every fed token (None: choose each round).
        probe: Rounds between probes at first, and again whenever the best choice changes.
        max_probe: The most rounds between probes; also how often, in prompts, every register after the prompt
            is fed where a draft wins.
        memory: Discount of the acceptance counts each time an offset is offered (recent drafts weigh more).
        smoothing: Weight of a new measurement in a cost's running average, after the mean of the first
            ``1/smoothing``.
        probe_share: The most of the time the probes' extra rows may take; must be > 0.
        margin: How much a draft's expected rate must beat plain decoding's by (0.05: 5 %).
        optimism: Standard errors added to each in-answer acceptance for the choice.
        clock: ``"wall"`` (``time.perf_counter``) or ``"cpu"`` (the thread's CPU time, meaningful with one
            intra-op thread on a CPU). Wall time is the default: it includes the time spent waiting for a core,
            which the user waits for too.
        warmup: Forwards of each row count not counted as its cost. 0 by default: a shape's first forward can
            cost more, but timing each draft twice costs runs near break-even more than it saves.
        level_gains: Speeds, rising within (0, 1], of the shared speed levels the costs follow; ``()``: none.

    Raises:
        ValueError: ``clock`` is neither ``"wall"`` nor ``"cpu"``, ``probe_share`` is not > 0, or
            ``level_gains`` does not rise within (0, 1].
    """

    CLOCKS = ("wall", "cpu")

    def __init__(self, k_max: int, fixed: Optional[int] = None, probe: int = 4, max_probe: int = 64,
                 memory: float = 0.95, smoothing: float = 0.05, probe_share: float = 0.001, margin: float = 0.05,
                 optimism: float = 0.5, clock: str = "wall", warmup: int = 0,
                 level_gains: tuple[float, ...] = (0.01, 0.05, 0.2, 0.5, 1.0)):
        if clock not in self.CLOCKS:
            raise ValueError(f"DraftLength: clock must be one of {', '.join(self.CLOCKS)}, not {clock!r}")
        self.clock = clock
        self.k_max, self.fixed, self.memory, self.smoothing, self.margin = k_max, fixed, memory, smoothing, margin
        self.optimism, self.warmup = optimism, warmup
        self.probe, self.min_probe, self.max_probe, self.probe_share = probe, probe, max_probe, probe_share
        if not probe_share > 0:
            raise ValueError(f"DraftLength: probe_share must be > 0, not {probe_share!r}")
        if level_gains and (sorted(level_gains) != list(level_gains) or not 0 < level_gains[0] <= level_gains[-1] <= 1):
            raise ValueError(f"DraftLength: level_gains must rise within (0, 1] (or be empty), not {level_gains!r}")
        self.cost: dict[int, float] = {}                   # seconds per forward at level 1, by its number of rows
        self.levels = {g: [0.0, 0.0, 0] for g in level_gains}   # per gain: log level, mean squared error, count
        self.measured: dict[int, int] = {}                 # forwards timed, by rows
        self.offered = [0.0] * (k_max + 1)                 # discounted counts per offset d (index d)
        self.accepted = [0.0] * (k_max + 1)
        self.first_offered = [0.0] * (k_max + 1)           # the same for the prompt's drafts (the answer's start)
        self.first_accepted = [0.0] * (k_max + 1)
        self.since_probe, self.last_best = 0, (1, False)
        self.prompt_row: Optional[float] = None            # seconds per row of the prompt's forward
        self.prompts, self.since_prompt_draft = 0, 0       # prompts timed; prompts since its registers were fed
        self.candidates = [(1, False)] + [(k, tail) for k in range(2, k_max + 1) for tail in (False, True)]
        self.tried: set[tuple[int, bool]] = {(1, False)}
        self.prepared: set[tuple[int, bool]] = set()       # tried ones whose draft was made for them first
        self.watched: list[list] = []                      # [draft, tokens of it decoded as drafted so far, first]

    @staticmethod
    def rows(k: int, tail: bool) -> int:
        """Rows of a round that feeds the pending token, a full draft of k-1 tokens and its registers."""
        return 2 * k - 1 if tail else k * k

    def expected_tokens(self, k: int) -> float:
        return self._chain(k)[0]

    def estimate(self, d: int, first: bool = False) -> float:
        """The acceptance of offset d: its discounted kept over offered drafts, one kept and one rejected draft as
        prior (``first``: of the prompt's registers)."""
        offered, accepted = (self.first_offered, self.first_accepted) if first else (self.offered, self.accepted)
        return (accepted[d] + 1) / (offered[d] + 2)

    def _chain(self, k: int, perfect: bool = False, first: bool = False, optimistic: bool = False) -> tuple[float, float]:
        """``(E(k), P(k))``: expected tokens of a round with a draft of k-1 tokens, chance all are kept
        (``perfect``: as if every draft were kept; ``first``: a draft of the prompt's registers; ``optimistic``:
        each acceptance ``optimism`` standard errors higher)."""
        offered = self.first_offered if first else self.offered
        total, run = 1.0, 1.0
        for d in range(2, k + 1):
            if perfect:
                p = 1.0
            elif not offered[d]:                           # an offset never checked is worth nothing yet
                p = 0.0
            else:
                p = self.estimate(d, first)
                if optimistic:
                    p = min(1.0, p + self.optimism * math.sqrt(p * (1 - p) / (offered[d] + 2)))
            run *= p
            total += run
        return total, run

    def seconds(self, rows: int) -> Optional[float]:
        """The cost of a forward of ``rows`` rows: its measured cost; not measured, the least measured cost at
        more rows, else the largest measured one's in proportion (None: nothing measured). Measured costs are
        not assumed to grow with the rows: in float32 on a CPU 2-3 rows can cost more than 4-9."""
        if rows in self.cost:
            return self.cost[rows]
        above = [c for r, c in self.cost.items() if r > rows]
        if above:
            return min(above)
        return max(self.cost.items())[1] * rows / max(self.cost) if self.cost else None

    def least_seconds(self, rows: int) -> float:
        """What a forward of ``rows`` rows costs at least, by a rough rule (more rows seldom cost less): its
        measured cost, else the most any measured forward with fewer rows costs (0 when none is measured)."""
        if rows in self.cost:
            return self.seconds(rows)
        return max((self.seconds(r) for r in self.cost if r < rows), default=0.0)

    def rate(self, k: int, tail: bool, cost=None, perfect: bool = False, first: bool = False,
             optimistic: bool = False) -> Optional[float]:
        """Expected tokens per second of the candidate (None: no cost known), at the costs ``cost(rows)``
        (default :meth:`seconds`)."""
        cost = cost or self.seconds
        c = cost(self.rows(k, tail))
        if not c:
            return None
        e, p = self._chain(k, perfect, first, optimistic)
        if not tail:
            return e / c
        return (e + 1 - p) / (c + (1 - p) * cost(k))

    def bar(self) -> float:
        """The rate a draft must beat: plain decoding's, raised by ``margin``."""
        return (1 + self.margin) * (self.rate(1, False) or 0.0)

    def best(self, first: bool = False) -> tuple[int, bool]:
        """The tried candidate with the most tokens per second, each in-answer acceptance at its upper bound;
        plain decoding unless a draft clears the bar."""
        rate = lambda c: self.rate(*c, first=first, optimistic=not first) or 0.0
        k, tail = max((c for c in self.candidates if c in self.tried), key=rate)
        return (k, tail) if k == 1 or rate((k, tail)) > self.bar() else (1, False)

    def hopeful(self) -> bool:
        """Whether some draft could clear the bar if it were kept whole (at the least it can cost)."""
        return 1 not in self.cost or any((self.rate(*c, cost=self.least_seconds, perfect=True) or float("inf")) > self.bar()
                                         for c in self.candidates[1:])

    def prompt_round(self) -> int:
        """The K of the prompt's round: the prompt's forward feeds K-1 registers after the prompt.

        Those registers draft the answer's first tokens (fed, or checked against the decoded ones). While plain
        decoding wins they are a probe, fed on the probes' schedule (K_max). Where a draft wins, of the answer's
        start or within the answer, the round after the prompt's feeds the prompt's draft, and the registers fed
        are those for one offset beyond the longer of the two winning drafts (so that the next round may take a
        draft one longer, and that offset's acceptance is checked); all K_max - 1 of them every ``max_probe``
        prompts. More would add rows to every prompt's forward for drafts the next round does not feed.

        Where only drafting within the answer wins, the prompt's registers are fed only where the expected draft
        gain pays for their rows in the prompt's forward (:meth:`_prompt_draft_pays`; otherwise the round after
        starts the in-answer draft itself): after a long prompt, registers whose draft of the answer's start is
        seldom kept cost more than they save.

        Returns:
            K in 1..``k_max`` (1: no register after the prompt).
        """
        if self.fixed is not None:
            return self.fixed
        if not self.hopeful():
            return 1
        if 1 not in self.cost:
            return self.k_max
        in_answer, first = self.best(), self.best(first=True)
        if first[0] > 1 or in_answer[0] > 1:
            self.since_prompt_draft += 1
            if self.since_prompt_draft >= self.max_probe:
                self.since_prompt_draft = 0
                return self.k_max
            if first[0] > 1 or self._prompt_draft_pays(in_answer):
                return min(self.k_max, max(first[0], in_answer[0]) + 1)
            return 1
        if self.since_probe >= self.interval((1, False)):
            self.since_probe = 0
            return self.k_max
        return 1

    def _prompt_draft_pays(self, in_answer: tuple[int, bool]) -> bool:
        """Where drafting within the answer wins: whether the prompt's registers pay for their rows in the
        prompt's forward. With their draft the round after feeds it whole, the in-answer K with registers after
        every fed token; without, one token and j-1 registers (j rows), starting the in-answer draft. The
        tokens their draft adds are priced at the in-answer rate, its acceptance at its upper bound."""
        if self.prompt_row is None:
            return True
        k = in_answer[0]
        extra = self._chain(k, first=True, optimistic=True)[0] - 1
        start = self.seconds(self._start_rows(k))
        fed = (self.k_max - 1) * self.prompt_row + self.seconds(self.rows(k, False))
        return fed < start + extra / self.rate(*in_answer)

    def choose(self, drafted: Optional[int] = None, first: bool = False, ends: bool = False) -> tuple[int, bool]:
        """This round's draft length and register placement.

        The round after the prompt's is the one place where registers after the answer's first token can be fed,
        and on a short answer the only one whose in-answer draft can still be checked. So there, where drafting
        within the answer wins and the prompt's draft is more often wrong than right at its first token (or never
        checked), the in-answer K with registers after every fed token: the next round has an in-answer draft
        although the prompt's draft is likely rejected. Otherwise the prompt's draft decides, and where it says to
        decode plainly the round is on the probes' schedule (K=2, a register after every fed token), so that the
        in-answer acceptance of short answers is checked at all. Without a prompt's draft (its registers not fed,
        :meth:`prompt_round`) where drafting within the answer wins, the round starts the in-answer draft: the
        pending token and j-1 registers, the cheapest j >= that K.

        Args:
            drafted: Tokens drafted for this round (None: a draft as long as any).
            first: This is the round after the prompt's, whose draft the prompt's registers made.
            ends: The draft reaches the answer's end (its eos, or ``max_new_tokens``).

        Returns:
            ``(K, tail)``: feed the pending token and K-1 drafted tokens, with registers after the last fed token
            only (``tail``) or after every one of them.
        """
        if self.fixed is not None:
            return self.fixed, False
        if self.k_max < 2 or 1 not in self.cost:           # a plain round first: the floor of every cost
            return 1, False
        if not first:
            return self._choose(drafted, False, ends)
        in_answer = self.best()
        if in_answer[0] > 1 and not drafted and not ends:  # no prompt's draft: start the in-answer one
            return self._start_rows(in_answer[0]), True
        if in_answer[0] > 1 and self._chain(2, first=True)[1] < 0.5:
            return in_answer[0], False
        pick = self._choose(drafted, True, ends)
        if pick[0] == 1:                                   # plain: this round is on the probes' schedule
            self.since_probe += 1
            if self._probe_due(in_answer):
                return 2, False                            # a register after the pending token: d=2 checked, and
        return pick                                        # 4 rows at most, what the probes' share is priced at

    def _choose(self, drafted: Optional[int], first: bool, ends: bool) -> tuple[int, bool]:
        if ends:                                           # nothing drafted: the registers foresee the end
            return self.last_round(drafted, first) if drafted else (1, False)
        drafted = self.k_max - 1 if drafted is None else drafted
        best = self.best(first)                            # the answer's start has its own acceptance
        top = max(self.rate(*best, first=first), self.bar())
        worth = [c for c in self.candidates if c not in self.tried
                 and (self.rate(*c, cost=self.least_seconds, first=first) or float("inf")) > top
                 and (not first or c[0] - 1 <= drafted)]  # the prompt's draft is all the first round has
        if worth:                                          # fewest rows first: its cost bounds the larger ones
            pick = min(worth, key=lambda c: self.rows(*c))
            if pick[0] - 1 > drafted and pick not in self.prepared:
                self.prepared.add(pick)                    # its draft first, so that its round is fed whole
                return self.k_max, True
            self.tried.add(pick)
            return pick
        if first:
            return best if drafted else (1, False)
        if best != self.last_best:
            self.last_best, self.since_probe, self.probe = best, 0, self.min_probe
        self.since_probe += 1
        if best[0] < self.k_max and self._probe_due(best):
            return self.k_max, True                        # registers for every offset after the last fed token
        if best[0] > 1 and not drafted:                    # no draft to feed: 1 token and j-1 registers, j rows
            return self._start_rows(best[0]), True
        return best

    def _start_rows(self, k: int) -> int:
        """Rows of a round with no draft to feed that starts a K-token draft: the pending token and j-1
        registers, the cheapest j >= K (in float32 on a CPU 4 rows can cost less than 2)."""
        return min(range(k, self.k_max + 1), key=self.seconds)

    def _probe_due(self, best: tuple[int, bool]) -> bool:
        """Whether a probe is due (then the interval doubles, up to ``max_probe``)."""
        if self.since_probe >= self.interval(best) and self.hopeful():
            self.since_probe, self.probe = 0, min(2 * self.probe, self.max_probe)
            return True
        return False

    def last_round(self, drafted: int, first: bool = False) -> tuple[int, bool]:
        """The choice for a draft that reaches the answer's end, where only this round counts.

        j drafted tokens and the pending one yield ``E(j + 1)`` tokens, against plain decoding's rate raised by
        ``margin``. The draft stops before the eos the registers foresaw, so the forward still feeds the j
        registers after its last token (a draft, in case the model goes on): 2j + 1 rows, and it is priced so.
        Registers after every fed token instead, (j + 1)^2 rows, where those cost less (float32 on a CPU: 4 rows
        can cost less than 3).

        Args:
            drafted: Tokens drafted up to the answer's end.
            first: The draft is the prompt's registers' (their own acceptance).

        Returns:
            ``(j + 1, tail)`` for the best j, or ``(1, False)`` (plain) when no draft clears the bar.
        """
        rates = {(j + 1, tail): self._chain(j + 1, first=first)[0] / (self.seconds(self.rows(j + 1, tail))
                                                                       or float("inf"))
                 for j in range(1, min(drafted, self.k_max - 1) + 1) for tail in (True, False)}
        best = max(rates, key=rates.get)
        return best if rates[best] > self.bar() else (1, False)

    def interval(self, best: tuple[int, bool]) -> float:
        """Rounds between probes: ``probe``, or more where a probe's extra rows would take more than
        ``probe_share`` of the time (a probe after a plain round feeds 1 token + K_max-1 registers). Until a
        draft within an answer has been checked at all, ``probe``: pricing the probes by their share assumes that
        what they would tell is already known, and on short answers would leave the first answers decoded
        plainly where drafting pays."""
        if not self.offered[2]:
            return self.probe
        probe_rows = self.k_max if best[0] == 1 else self.rows(self.k_max, True)
        known = any(r >= probe_rows for r in self.cost)   # else priced as the largest measured forward
        c = self.seconds(probe_rows) if known else self.cost[max(self.cost)]
        extra = max(c / self.seconds(self.rows(*best)) - 1, 0.0)
        return max(self.probe, extra / self.probe_share)

    def observe(self, drafted: int, kept: int, first: bool = False) -> None:
        """One verification: of ``drafted`` drafts, the first ``kept`` equal greedy's tokens (``first``: the
        prompt's registers drafted them)."""
        offered, accepted = (self.first_offered, self.first_accepted) if first else (self.offered, self.accepted)
        for d in range(2, min(drafted, kept + 1) + 2):     # offered: every draft up to the first mismatch
            offered[d] = self.memory * offered[d] + 1
            accepted[d] = self.memory * accepted[d] + (d - 2 < kept)

    def watch(self, draft: list[int], first: bool = False) -> None:
        """The registers' draft for the tokens after the next one, fed or not: :meth:`emitted` settles it
        (``first``: the prompt's registers made it)."""
        self.watched.append([list(draft), 0, first])

    def emitted(self, tokens: list[int]) -> None:
        """Tokens just decoded, in order: each watched draft is settled as verification would (:meth:`observe`)
        at its first token that differs, or when all of it has been decoded."""
        for t in tokens:
            going = []
            for w in self.watched:
                draft, seen, first = w
                if t != draft[seen]:
                    self.observe(len(draft), seen, first)
                elif seen + 1 == len(draft):
                    self.observe(len(draft), len(draft), first)
                else:
                    w[1] += 1
                    going.append(w)
            self.watched = going

    def flush(self) -> None:
        """Decoding ended before the watched drafts were settled: the tokens checked so far count."""
        for draft, seen, first in self.watched:
            if seen:
                self.observe(seen, seen, first)
        self.watched = []

    def state(self) -> dict:
        """What the chooser believes now: ms per forward by rows (and how many forwards of each it timed), the
        acceptance estimate per offset checked, and its choice (a benchmark row's record of why it drafted so)."""
        gain, level = self.level()
        return {"ms_by_rows": {r: round(1000 * c, 1) for r, c in sorted(self.cost.items())},
                "timed_by_rows": dict(sorted(self.measured.items())),
                "acceptance_estimate": {f"d={d}": round(self.estimate(d), 3)
                                        for d in range(2, self.k_max + 1) if self.offered[d]},
                "best": list(self.best()) if 1 in self.cost else None,
                "level": {"gain": gain, "level": round(level, 3),
                          "rms_error_by_gain": {g: round(math.sqrt(lv[1]), 3) for g, lv in self.levels.items()}}}

    def timer(self) -> Callable[[], float]:
        """The clock to time this chooser's forwards by (see ``clock``)."""
        return time.thread_time if self.clock == "cpu" else time.perf_counter

    def record_prompt(self, rows: int, seconds: float) -> None:
        """The measured seconds of the prompt's forward of ``rows`` rows (its registers included): a running
        average of its seconds per row, what a register after the prompt costs."""
        self.prompts += 1
        per = seconds / rows
        self.prompt_row = per if self.prompt_row is None else _running_mean(self.prompt_row, per, self.prompts,
                                                                            self.smoothing)

    def record(self, rows: int, seconds: float) -> None:
        """The measured seconds of a forward of ``rows`` rows (tokens and registers): the first ``warmup`` of
        each row count not counted (see ``warmup``; a draft tried then is tried again), then the mean of the
        first ``1/smoothing`` measurements, then a running average of weight ``smoothing``; one measurement moves
        it by at most as much as twice the average would (a load spike is not a new cost)."""
        n = self.measured[rows] = self.measured.get(rows, 0) + 1
        if n <= self.warmup:
            self.tried -= {c for c in self.candidates[1:] if self.rows(*c) == rows}
            return
        n -= self.warmup
        seconds /= self._follow_level(rows, seconds)
        old = self.cost.get(rows)
        self.cost[rows] = seconds if old is None else _running_mean(old, min(seconds, 2 * old), n, self.smoothing)

    def level(self) -> tuple[float, float]:
        """``(gain, level)``: the shared speed level used now, the one with the least recent error (the slowest
        until it has predicted 20 forwards; ``(0.0, 1.0)`` without levels)."""
        if not self.levels:
            return 0.0, 1.0
        slowest = min(self.levels)
        g = min(self.levels, key=lambda g: self.levels[g][1]) if self.levels[slowest][2] >= 20 else slowest
        return g, math.exp(self.levels[g][0])

    def _follow_level(self, rows: int, seconds: float) -> float:
        """Each level's prediction of this forward scored and the level moved toward it; returns the level it was
        predicted at (by the level in use), which the measurement is divided by."""
        level = self.level()[1]
        if rows not in self.cost or not self.levels:
            return level
        for g, lv in self.levels.items():
            e = min(max(seconds / (self.cost[rows] * math.exp(lv[0])) - 1, -0.5), 1.0)   # relative error, half
            lv[2] += 1                                     # to 2x; the mean of the first 50, then weight 0.02
            lv[1] = _running_mean(lv[1], e * e, lv[2], 0.02)
            lv[0] += math.log1p(g * e)
        fold = self.levels[min(self.levels)][0]            # the slowest level goes into the averages
        for lv in self.levels.values():
            lv[0] -= fold
        self.cost = {r: c * math.exp(fold) for r, c in self.cost.items()}
        return level * math.exp(-fold)

