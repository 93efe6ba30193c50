"""How much to draft each round: an acceptance estimate, the cost of a forward by its rows, and the choice.

Three parts, each doing one thing, and their settings in one frozen dataclass:

- :class:`Acceptance`: per offset d, the chance that a draft for ``x_{e+d}`` is kept given that every earlier
  draft of its round was (discounted counts);
- :class:`RowCosts`: the seconds of a forward by its number of rows, at a speed level shared by every row count
  (a load on the machine slows them alike);
- :class:`DraftPolicy`: the choice: the candidate with the most expected tokens per second (in an answer's last
  round, the feed that finishes it soonest).

The choice exploits the estimates, and explores on a budget: where the candidate that is best when every
acceptance is taken ``optimism`` standard errors high and every cost as many low differs from the best one, it is
taken instead as long as the time exploring has lost stays within ``explore`` of the decoding time. The loss is
counted after each explored round, as measured (its seconds beyond what the best candidate would take for the
tokens it gave), not as estimated: estimates that have not been fed are what exploring tries, so they are the
ones that can be wrong, and an explored round that pays refunds its share. Learning what a count of rows costs is
exploring too: until a count has been timed ``trust`` times it is priced at most what a smaller count costs (so
that every candidate that could win is tried) unless its timings so far exceed that by more than their noise
allows (``doubt``: on a quiet machine one forward of a dear count rules it out), its rounds are charged the same
way, and no such count is tried once the budget is ``trials`` plain forwards below zero (where extra rows are
dear, as with a 262k-token vocabulary's logits on a CPU, trying them all would cost more than the answers'
decoding gains). What has not been observed for a while (``revisit``) loses its weight, so its uncertainty grows
back: a choice that looked bad on one unlucky measurement is tried again, while exploring never costs more than
its share. Only the steady-state draft length explores: the prompt's registers and the round after the prompt's
are decided on the estimates as they stand (an answer of a few tokens is mostly that round, and a round explored
there is a large share of it; replayed on recorded traces of 4-token answers, exploring there cost 1.4-4.6 % of
the decoding time)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class DraftSettings:
    """The settings of :class:`DraftPolicy` (every number the policy uses is one of these)."""

    memory: float = field(default=0.99, metadata={
        "help": "Discount of an offset's acceptance counts each time a draft for it is checked: recent drafts "
                "weigh more (0.99: about the last 100)."})
    revisit: float = field(default=400.0, metadata={
        "help": "Rounds over which an estimate that is not renewed (an acceptance not observed, a row count not "
                "fed) loses its weight, so that its uncertainty grows back and it is explored again."})
    optimism: float = field(default=1.0, metadata={
        "help": "Standard errors each acceptance is taken high and each cost low for exploring: which candidate "
                "is worth trying."})
    explore: float = field(default=0.005, metadata={
        "help": "The most of the decoding time exploring may lose, as measured after each explored round: "
                "0.005 is 0.5 %."})
    trials: float = field(default=6.0, metadata={
        "help": "Plain forwards' worth of seconds that trying counts of rows may lose beyond the exploring budget. "
                "A round whose count of rows is measured fewer than ``trust`` times is charged to the budget as "
                "measured, and no such count is tried while the budget is below minus this: where extra rows "
                "are dear (a large vocabulary's logits), learning so stops after a few forwards' loss."})
    smoothing: float = field(default=0.05, metadata={
        "help": "Weight of a new measurement in a row count's cost, after the mean of the first 1/smoothing."})
    level_gains: tuple = field(default=(0.0, 0.05, 0.3), metadata={
        "help": "How fast the speed level shared by every row count may follow the measurements: each of these "
                "speeds predicts every forward, and the one whose predictions erred least lately is used (0: not "
                "at all, for a load that varies from forward to forward without moving; larger: one that moves). "
                "The last one is used until 1/smoothing forwards have been predicted."})
    spike: float = field(default=2.0, metadata={
        "help": "A measurement counts at most this many times (and at least 1/spike of) what the costs "
                "predicted: one spike of load is not a new cost."})
    trust: int = field(default=3, metadata={
        "help": "Forwards of a row count before its measured cost is trusted over the least it may cost (one "
                "slow forward does not rule a draft out)."})
    doubt: float = field(default=2.0, metadata={
        "help": "Before ``trust`` forwards, a count of rows is priced at its measured cost taken this many "
                "standard errors low (the spread of the forwards around their predictions, over the root of "
                "its forwards), where that is more than the least it may cost: on a quiet machine one slow "
                "forward of a dear count (a large vocabulary's logits) rules it out, under a load it takes more."})
    margin: float = field(default=0.0, metadata={
        "help": "How much a draft's expected rate must beat plain decoding's by (0.05: 5 %)."})
    clock: str = field(default="wall", metadata={
        "help": "What a forward is timed by: 'wall' (time.perf_counter, what the user waits for) or 'cpu' (the "
                "thread's CPU time, meaningful with one intra-op thread on a CPU)."})

    def __post_init__(self):
        allowed = {"memory": (0 < self.memory <= 1, "in (0, 1]"), "revisit": (self.revisit >= 1, ">= 1"),
                   "optimism": (self.optimism >= 0, ">= 0"), "explore": (0 <= self.explore < 1, "in [0, 1)"),
                   "trials": (self.trials >= 0, ">= 0"), "smoothing": (0 < self.smoothing <= 1, "in (0, 1]"),
                   "level_gains": (isinstance(self.level_gains, tuple) and len(self.level_gains) > 0
                                   and all(isinstance(g, (int, float)) and 0 <= g < 1 for g in self.level_gains),
                                   "a non-empty tuple of numbers in [0, 1)"),
                   "spike": (self.spike > 1, "> 1"),
                   "trust": (isinstance(self.trust, int) and self.trust >= 1, "an integer >= 1"),
                   "doubt": (self.doubt >= 0, ">= 0"),
                   "margin": (self.margin >= 0, ">= 0"), "clock": (self.clock in ("wall", "cpu"), "'wall' or 'cpu'")}
        for name, (ok, rule) in allowed.items():
            if not ok:
                raise ValueError(f"DraftSettings.{name} must be {rule}, not {getattr(self, name)!r}")

    @property
    def forget(self) -> float:
        """The factor every count is multiplied by each round (from ``revisit``)."""
        return 1.0 - 1.0 / self.revisit


class Acceptance:
    """Per offset d in 2..k_max, how often a draft for ``x_{e+d}`` is kept when every earlier one was.

    Kept over checked drafts, with two drafts at the ``prior``'s estimate (else one kept and one rejected) as
    prior; at each check every earlier draft weighs ``memory`` times less, and each round every count (the prior
    too) ``forget`` times less: the estimate stays, its uncertainty grows back. An offset that no draft has been
    checked at, because every draft that reached it foresaw the answer's end there (answers too short for it),
    adds nothing to a round's expected tokens: its prior would promise tokens no round can give.

    Args:
        k_max: The longest draft length K (offsets 2..K).
        settings: The policy's settings.
        prior: Another estimate this one starts from (the prompt's drafts start from the in-answer ones).
    """

    def __init__(self, k_max: int, settings: DraftSettings, prior: Optional["Acceptance"] = None):
        self.settings, self.prior = settings, prior
        self.checked = [0.0] * (k_max + 1)                # discounted counts per offset d (index d)
        self.kept = [0.0] * (k_max + 1)
        self.weight = [2.0] * (k_max + 1)                 # the prior's, in drafts
        self.reached = [False] * (k_max + 1)              # a draft was ever checked at offset d
        self.ended = [False] * (k_max + 1)                # a draft reached offset d as the answer's eos

    def observe(self, drafted: int, kept: int, ended: bool = False) -> None:
        """One draft checked: of its ``drafted`` tokens (offsets 2, 3, ...) the first ``kept`` were right.

        Args:
            drafted: Draft tokens checked.
            kept: Of those, how many were right, from the first.
            ended: The draft foresaw the eos right after its tokens, and they were all right.
        """
        m = self.settings.memory
        for d in range(2, min(drafted, kept + 1) + 2):     # checked: every token up to the first wrong one
            self.checked[d] = m * self.checked[d] + 1
            self.kept[d] = m * self.kept[d] + (d - 2 < kept)
            self.weight[d] *= m
            self.reached[d] = True
        if ended and kept == drafted and drafted + 2 < len(self.ended):
            self.ended[drafted + 2] = True

    def forget(self) -> None:
        """A round passed: every count loses a little weight (``revisit``)."""
        f = self.settings.forget
        self.checked, self.kept, self.weight = ([f * c for c in v] for v in (self.checked, self.kept, self.weight))

    def estimate(self, d: int, optimistic: bool = False) -> float:
        """The acceptance of offset d (``optimistic``: ``optimism`` standard errors high, at most 1; 0 where drafts
        reached d only as answers' ends)."""
        if not optimistic and self.ended[d] and not self.reached[d]:
            return 0.0
        p0 = 0.5 if self.prior is None else self.prior.estimate(d)
        n = self.checked[d] + self.weight[d]
        p = (self.kept[d] + self.weight[d] * p0) / n
        return min(1.0, p + self.settings.optimism * math.sqrt(p * (1 - p) / n)) if optimistic else p

    def expected(self, k: int, optimistic: bool = False) -> tuple[float, float]:
        """``(E, P)`` for a draft of k-1 tokens: the tokens a round yields on average (the model's own next token
        included) and the chance that the whole draft is kept."""
        total, run = 1.0, 1.0
        for d in range(2, k + 1):
            run *= self.estimate(d, optimistic)
            total += run
        return total, run


class RowCosts:
    """The seconds of a forward by its rows: ``exp(level + ratio[rows])``.

    ``level`` is shared by every row count and follows each measurement at a speed (a gain); ``ratio[rows]`` is
    the running mean of that count's measurements over the level (the mean of the first ``1/smoothing``, then
    weight ``smoothing``). So a load that slows every forward moves the costs of the counts not fed lately with
    the ones fed, instead of leaving them at the speed of when they were fed. How fast the level should follow
    depends on the load: one that moves is followed, while following one that varies from forward to forward
    only adds noise to every ratio (a plain forward timed once on a spike would make every draft look cheap). So
    the level is kept at each speed of ``level_gains`` at once, each with its own ratios, and the speed whose
    predictions of the measurements erred least lately is the one used. A measurement counts at ``spike``
    times the prediction at most. The spread of the measurements around the predictions (``noise``) is what
    the optimistic cost is taken low by.

    Args:
        settings: The policy's settings.
    """

    def __init__(self, settings: DraftSettings):
        self.settings = settings
        gains = settings.level_gains
        self.levels = [0.0] * len(gains)                   # log seconds, at each speed
        self.ratios: list[dict[int, float]] = [{} for _ in gains]   # log seconds over the level, by rows
        self.square_errors = [0.0] * len(gains)            # recent squared prediction errors, at each speed
        self.use = len(gains) - 1                          # the speed used
        self.count: dict[int, float] = {}                  # measurements, discounted by forget
        self.measured: dict[int, int] = {}                 # measurements, all of them
        self.errors = 0                                    # measurements predicted
        self.open = True                                   # counts not yet trusted may be priced (else inf)
        self._cache: dict[bool, dict[int, float]] = {}     # seconds by rows, plain and optimistic (_table)

    @property
    def level(self) -> float:
        """The shared speed level (log seconds) at the speed used."""
        return self.levels[self.use]

    @property
    def ratio(self) -> dict[int, float]:
        """Each measured count's log seconds over the level, at the speed used."""
        return self.ratios[self.use]

    @property
    def square_error(self) -> float:
        """The recent squared error (in log seconds) of the predictions at the speed used."""
        return self.square_errors[self.use]

    def record(self, rows: int, seconds: float) -> None:
        """A forward of ``rows`` rows took ``seconds``.

        Args:
            rows: Its rows (tokens and registers).
            seconds: What it took.
        """
        s = self.settings
        self._cache.clear()
        x = math.log(max(seconds, 1e-12))
        n = self.measured[rows] = self.measured.get(rows, 0) + 1
        self.count[rows] = self.count.get(rows, 0.0) + 1
        if rows not in self.ratio:
            for level, ratio in zip(self.levels, self.ratios):
                ratio[rows] = x - level
            return
        cap = math.log(s.spike)
        self.errors += 1
        for i, g in enumerate(s.level_gains):
            e = min(max(x - self.levels[i] - self.ratios[i][rows], -cap), cap)
            self.square_errors[i] += (e * e - self.square_errors[i]) * max(1 / self.errors, s.smoothing)
            self.levels[i] += g * e
            self.ratios[i][rows] += max(1 / n, s.smoothing) * (1 - g) * e
        if self.errors * s.smoothing >= 1:
            self.use = min(range(len(s.level_gains)), key=lambda i: (self.square_errors[i], -i))

    def forget(self) -> None:
        """A round passed: each count's measurements lose a little weight (``revisit``)."""
        self.count = {r: self.settings.forget * c for r, c in self.count.items()}
        self._cache.pop(True, None)                         # the optimistic costs depend on the counts

    def seconds(self, rows: int, optimistic: bool = False) -> float:
        """The seconds of a forward of ``rows`` rows: measured, its estimate (``optimistic``: ``optimism``
        standard errors low), while measured fewer than ``trust`` times at most the most a count with fewer rows
        costs, unless its estimate ``doubt`` standard errors low is more; not measured, the most a measured count
        with fewer rows costs (more rows seldom cost less; costs are not assumed to grow with the rows either:
        in float32 on a CPU 4 rows can cost less than 2). Infinite when no count with fewer rows is measured,
        and for a count of more than one row measured fewer than ``trust`` times while not :attr:`open` (its
        trial is exploring, on the budget)."""
        if not self.open and rows > 1 and not self.trusted(rows):
            return math.inf
        table = self._table(optimistic)
        if rows in table:
            return table[rows]
        return max((c for r, c in table.items() if r < rows), default=math.inf)

    @contextmanager
    def closed(self):
        """Prices as while trying is closed (a count not yet trusted at inf), whatever :attr:`open` says."""
        was, self.open = self.open, False
        try:
            yield self
        finally:
            self.open = was

    def trusted(self, rows: int) -> bool:
        """Whether a forward of ``rows`` rows has been timed ``trust`` times (its measured cost is trusted)."""
        return self.measured.get(rows, 0) >= self.settings.trust

    def _table(self, optimistic: bool) -> dict[int, float]:
        """Every measured count's seconds, in one pass by rows (a count measured fewer than ``trust`` times at
        most the most a count with fewer rows costs, or its estimate ``doubt`` standard errors low if that is
        more); kept until the next measurement or round."""
        if optimistic in self._cache:
            return self._cache[optimistic]
        s = self.settings
        noise = math.sqrt(self.square_error) if self.errors else math.log(s.spike) / 2
        table: dict[int, float] = {}
        least = math.inf                                    # the most a count with fewer rows costs
        for r in sorted(self.ratio):
            c = math.exp(self.level + self.ratio[r])
            if optimistic:
                c *= math.exp(-s.optimism * noise / math.sqrt(self.count[r] + 1))
            if not self.trusted(r):                         # the bound, unless timed clearly above it
                c = min(c, max(least, c * math.exp(-s.doubt * noise / math.sqrt(self.measured[r]))))
            table[r] = c
            least = c if least == math.inf else max(least, c)
        self._cache[optimistic] = table
        return table


def rows(feed: int, registers: int, tail: bool, last: bool = False) -> int:
    """Rows of a forward of ``feed`` tokens with ``registers`` registers after each of them (``tail``: after the
    last one only); ``last``: keeping the last fed token ends the answer, so no register follows it."""
    return feed + registers * max((1 if tail else feed) - last, 0)


class DraftPolicy:
    """Chooses each round's draft: how many drafted tokens to feed, and the registers after them.

    A round feeds the newest kept token and j drafted tokens, and r registers (offsets 2..r+1) after each of
    them ("full": the next round always has a draft) or after the last one only ("tail": fewer rows, and a
    rejected draft leaves the next round without one). In steady state j = r = K-1, and a candidate (K, tail)
    yields, per second:

    - full, K^2 rows: ``E(K) / c(K^2)``, ``E(K) = 1 + sum_{j=2..K} prod_{d=2..j} p_d`` the expected tokens;
    - tail, 2K-1 rows: ``(E(K) + 1 - P(K)) / (c(2K-1) + (1 - P(K)) c(K))``, counting the draftless round
      (the token and K-1 registers) that follows a rejected draft; ``P(K)`` the chance the whole draft is kept;

    and plain decoding (K = 1) unless a draft beats it by ``margin``. A count of rows not measured yet is taken
    to cost the most a measured count with fewer rows does (and one measured fewer than ``trust`` times at most
    that, unless clearly above it), so each candidate that could win is tried, while
    trying loses no more than the exploring budget and ``trials`` plain forwards (see the module). A
    round that has no draft to feed feeds the token and r registers, the cheapest r >= K-1 (in float32 on a CPU
    4 rows can cost less than 2).

    The drafts of the prompt's registers (an answer's first tokens) have their own acceptance, which starts from
    the in-answer one. Answers can be too short for the steady state, so the round after the prompt's feeds the
    part of that draft (and the registers after it) that gains the most tokens over the steady rate for the time
    it takes, and the prompt's forward feeds registers for what that round would feed, each priced at a row of
    the prompt's forward. A round whose draft, kept whole, ends the answer takes the feed that finishes the
    answer soonest (:meth:`plan`), since no steady state follows it.

    Exploring: see the module. One instance can decode many prompts: what it learned carries over, so short
    answers do not each pay for learning the costs. Until a plain forward is timed, a round feeds no draft and
    the prompt's forward every register (what they draft is checked for free, against the tokens decoded after
    them).

    Args:
        k_max: The longest draft length K (the newest kept token and K-1 drafted ones), at most the model's
            ``d_max``.
        settings: The settings (default: ``DraftSettings()``).

    Raises:
        ValueError: ``k_max`` < 1.
    """

    def __init__(self, k_max: int, settings: Optional[DraftSettings] = None):
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"DraftPolicy: k_max must be an integer >= 1, not {k_max!r}")
        self.k_max = k_max
        self.settings = settings if settings is not None else DraftSettings()
        self.acceptance = Acceptance(k_max, self.settings)               # within an answer
        self.first = Acceptance(k_max, self.settings, self.acceptance)   # the prompt's registers' drafts
        self.costs = RowCosts(self.settings)
        self.candidates = [(1, False)] + [(k, tail) for k in range(2, k_max + 1) for tail in (False, True)]
        self.prompt_row: Optional[float] = None                         # seconds a row of the prompt's forward
        self.prompts = 0
        self.budget = 0.0                                                # seconds exploring may still lose
        self._explored: Optional[float] = None      # this round explores: the rate of the best candidate instead
        self._steady: Optional[tuple[tuple[int, bool], float]] = None   # best() and its rate, until they change
        self._hope: Optional[tuple[int, bool]] = None                   # the most hopeful candidate, likewise

    # --------------------------------------------------------------------- the choice
    def _registers(self, feed: int, at_least: int, tail: bool, optimistic: bool = False) -> int:
        """The cheapest register count >= ``at_least`` (0 stays 0) for ``feed`` tokens."""
        if at_least == 0 or feed > 1:
            return at_least
        return min(range(at_least, self.k_max),
                   key=lambda r: (self.costs.seconds(rows(feed, r, tail), optimistic), r))

    def _yield(self, k: int, tail: bool, acceptance: Acceptance, r: int, extra: float = 0.0,
               optimistic: bool = False) -> tuple[float, float]:
        """``(tokens, seconds)`` expected of a round that feeds k-1 drafted tokens with r registers after them: with
        ``tail``, a rejected draft costs the draftless round after it too (the token and r registers); ``extra``
        seconds besides the forward."""
        e, p = acceptance.expected(k, optimistic)
        cost = lambda f, t: self.costs.seconds(rows(f, self._registers(f, r, t, optimistic), t), optimistic)  # noqa
        fed = cost(k, tail) + extra
        if not tail or r == 0:
            return e, fed
        return e + 1 - p, fed + (1 - p) * cost(1, True)

    def rate(self, k: int, tail: bool, optimistic: bool = False) -> float:
        """Expected tokens per second of the steady-state candidate ``(k, tail)``: k-1 drafted tokens fed and k-1
        registers after them."""
        tokens, seconds = self._yield(k, tail, self.acceptance, k - 1, optimistic=optimistic)
        return tokens / seconds

    def best(self, explore: bool = False) -> tuple[int, bool]:
        """The steady-state candidate ``(K, tail)`` with the most expected tokens per second; plain decoding
        ``(1, False)`` unless a draft beats it by ``margin``. ``explore``: another one where the budget allows
        (see the module). Both are kept until the estimates they rest on change (:meth:`record`, :meth:`observe`)."""
        if self.k_max < 2 or 1 not in self.costs.ratio:
            return 1, False
        handicap = lambda c: 1.0 if c[0] == 1 else 1 + self.settings.margin                 # noqa: E731
        if self._steady is None:
            candidates = self.candidates
            rate = {c: self.rate(*c) for c in candidates}
            value = {c: rate[c] / handicap(c) for c in candidates}
            best = max(candidates, key=value.__getitem__)
            untried = [c for c in candidates[1:] if not self.costs.trusted(rows(c[0], c[0] - 1, c[1]))]
            if best in untried:                            # fewest rows first: its cost bounds the larger ones'
                bar = max(value[c] for c in candidates if c not in untried)
                best = min((c for c in untried if value[c] > bar), key=lambda c: (rows(c[0], c[0] - 1, c[1]), c))
            self._steady = best, rate[best]
        best, pace = self._steady
        if explore:                                        # the most hopeful instead, where the budget covers it
            if self._hope is None:
                self._hope = max(self.candidates, key=lambda c: self.rate(*c, optimistic=True) / handicap(c))
            hope = self._hope
            if hope != best:
                tokens, seconds = self._yield(hope[0], hope[1], self.acceptance, hope[0] - 1)
                lost = seconds - tokens / pace             # its round's seconds beyond best's for as many tokens
                if lost <= self.budget:                    # charged as measured once the round is done (record)
                    self._explored = pace
                    return hope
        return best

    def plan(self, drafted: int, first: bool = False, ends: bool = False) -> tuple[int, int, bool]:
        """This round's forward.

        Args:
            drafted: Draft tokens at hand (what the registers after the newest kept token drafted).
            first: The draft is the prompt's registers' (the round after the prompt's).
            ends: Kept whole, the draft ends the answer (it foresaw the eos, or it fills ``max_new_tokens``); with
                no draft at hand, the answer ends with this round's token or the next (no register can help).

        Returns:
            ``(j, r, tail)``: feed j of the drafted tokens after the newest kept token, and r registers after each
            fed token (``tail``: after the last one only).
        """
        if ends:                                           # the answer's last round, if its draft is kept
            return self._finish(drafted, first) if drafted else (0, 0, False)
        return self._round(drafted, first)

    def _round(self, drafted: int, first: bool) -> tuple[int, int, bool]:
        """This round's forward as if the answer went on (the steady choice, or the prompt's draft's part)."""
        k, tail = self.best(explore=True)
        if first:                                          # the prompt's draft, at its own acceptance
            j, tail = self._gainful(drafted, k - 1, self.first)
        else:
            j = min(drafted, k - 1)
        return j, self._registers(j + 1, k - 1, tail), tail

    def _finish(self, drafted: int, first: bool) -> tuple[int, int, bool]:
        """A round whose draft, kept whole, ends the answer: the feed that finishes it soonest, in expected
        seconds: this round, then the tokens a rejected draft leaves, at plain decoding's pace where no register
        follows a kept token, else at the steady pace. The usual round feeds registers (they draft the next round
        where the draft is rejected), the others none; the steady rate does not apply here, since no steady state
        follows the answer's end."""
        if 1 not in self.costs.ratio:                      # nothing timed yet: the whole draft, no register
            return drafted, 0, False
        acceptance = self.first if first else self.acceptance
        plain = self.costs.seconds(1)
        steady = min(1 / self.rate(*self.best()), plain)   # seconds a token where a draft is at hand

        def seconds(option: tuple[int, int, bool]) -> float:
            j, r, tail = option
            tokens = acceptance.expected(j + 1)[0]
            return self.costs.seconds(rows(j + 1, r, tail, j == drafted)) + (drafted + 1 - tokens) * (
                steady if r else plain)
        j, r, tail = usual = self._round(drafted, first)
        if rows(j + 1, r, tail, j == drafted) == j + 1:    # no register follows the token that ends the answer
            usual = (j, 0, False)
        options = [(j, 0, False) for j in range(min(drafted, self.k_max - 1) + 1)] + [usual]
        choice = min(options, key=seconds)                 # the first of equals: fewer registers
        if choice != usual:
            self._explored = None                          # only the usual round may explore
        return choice

    def _gainful(self, drafted: int, r: int, acceptance: Acceptance, extra: float = 0.0) -> tuple[int, bool]:
        """``(j, tail)``: the feed of at most ``drafted`` drafted tokens, with r registers after them, that gains
        the most tokens over decoding at the steady rate for as long (answers can be too short for the steady
        state: a round is worth what it yields beyond that); ``extra``: seconds per drafted token besides (the
        prompt's registers)."""
        steady = self.rate(*self.best())

        def gain(o: tuple[int, bool]) -> float:
            tokens, seconds = self._yield(o[0] + 1, o[1], acceptance, r, o[0] * extra)
            return tokens - steady * seconds
        options = [(j, tail) for j in range(min(drafted, self.k_max - 1) + 1) for tail in (False, True)]
        return max(options, key=gain)

    def prompt_registers(self) -> int:
        """The registers the prompt's forward feeds after the prompt: those whose draft the round after would
        feed, each priced at a row of the prompt's forward (all of them until a plain forward is timed).

        Returns:
            0..k_max-1.
        """
        if 1 not in self.costs.ratio:
            return self.k_max - 1
        return self._gainful(self.k_max - 1, self.best()[0] - 1, self.first, self.prompt_row or 0.0)[0]

    # ------------------------------------------------------------------ what it learns
    def record(self, rows: int, seconds: float, prompt: bool = False, tokens: int = 1) -> None:
        """A forward of ``rows`` rows took ``seconds`` (``prompt``: the prompt's, with its registers; it prices a
        register after the prompt, not a round). Each forward adds its share to the exploring budget, an explored
        round (or one that tried a count of rows) takes what it lost from it, and each estimate loses a little
        weight.

        Args:
            rows: The forward's rows (tokens and registers).
            seconds: What it took, by this policy's clock.
            prompt: It was the prompt's forward.
            tokens: The tokens the round gave.
        """
        self.budget += self.settings.explore * seconds
        trial = not prompt and rows > 1 and not self.costs.trusted(rows)
        pace = self._explored or (self._trusted_rate() if trial else None)
        if pace and not prompt:                            # its seconds beyond the best's for as many tokens
            self.budget -= seconds - tokens / pace
        self._explored = None
        if prompt:                                         # no in-answer estimate changes: best() stands
            self.prompts += 1
            per = seconds / rows
            w = max(1 / self.prompts, self.settings.smoothing)
            self.prompt_row = per if self.prompt_row is None else (1 - w) * self.prompt_row + w * per
            self.first.forget()
            return
        self._steady = self._hope = None
        self.acceptance.forget()
        self.costs.forget()
        self.costs.record(rows, seconds)
        plain = self.costs.seconds(1)                      # trying counts of rows: while the budget allows
        self.costs.open = plain == math.inf or self.budget > -self.settings.trials * plain

    def _trusted_rate(self) -> float:
        """Tokens per second of the best steady-state candidate whose row counts are all trusted (plain decoding
        at least): what a round that tries a count of rows instead is charged against."""
        if 1 not in self.costs.ratio:
            return 0.0
        with self.costs.closed():
            return max(self.rate(*c) for c in self.candidates)

    def observe(self, drafted: int, kept: int, first: bool = False, ended: bool = False) -> None:
        """A draft checked (fed and verified, or settled by the tokens decoded after it).

        Args:
            drafted: Its tokens.
            kept: Of those, how many were right, from the first.
            first: The prompt's registers drafted it.
            ended: It foresaw the eos right after its tokens (see :class:`Acceptance`).
        """
        if first:                                          # the prompt's drafts: best() does not read them
            self.first.observe(drafted, kept, ended)
            return
        self.acceptance.observe(drafted, kept, ended)
        self._steady = self._hope = None

    def state(self) -> dict:
        """What the policy believes now (a benchmark row's record of why it drafted as it did): ms per forward by
        rows and how many forwards of each it timed, the acceptance estimates and its steady-state choice."""
        checked = lambda acc: {f"d={d}": round(acc.estimate(d), 3)            # noqa: E731
                               for d in range(2, self.k_max + 1) if acc.checked[d]}
        return {"ms_by_rows": {r: round(1000 * self.costs.seconds(r), 2) for r in sorted(self.costs.ratio)},
                "timed_by_rows": dict(sorted(self.costs.measured.items())),
                "acceptance_estimate": checked(self.acceptance), "first_estimate": checked(self.first),
                "best": list(self.best()) if 1 in self.costs.ratio else None}


class FixedDraft:
    """Always K: K-1 registers after the prompt and after every fed token, and the whole draft fed
    (``generate(..., draft_registers=K)``; K = 1 is plain decoding).

    Args:
        k: The draft length K >= 1.
        settings: Only its ``clock`` is used.

    Raises:
        ValueError: ``k`` < 1.
    """

    def __init__(self, k: int, settings: Optional[DraftSettings] = None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"FixedDraft: K must be an integer >= 1, not {k!r}")
        self.k_max = k
        self.settings = settings if settings is not None else DraftSettings()

    def plan(self, drafted: int, first: bool = False, ends: bool = False) -> tuple[int, int, bool]:
        """The whole draft (at most K-1 tokens) and K-1 registers after every fed token."""
        return min(drafted, self.k_max - 1), self.k_max - 1, False

    def prompt_registers(self) -> int:
        """K-1 registers after the prompt."""
        return self.k_max - 1

    def record(self, rows: int, seconds: float, prompt: bool = False, tokens: int = 1) -> None:
        """Nothing to learn."""

    def observe(self, drafted: int, kept: int, first: bool = False, ended: bool = False) -> None:
        """Nothing to learn."""

    def state(self) -> dict:
        """Its K."""
        return {"fixed": self.k_max}
