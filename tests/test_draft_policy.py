"""The draft policy's parts, without a model: its settings refuse bad values by name, the acceptance estimate
follows what was kept, a forward's cost by its rows is measured and not assumed, and the choice drafts long
where drafts are kept and rows are cheap and plainly where drafts are rejected; the proposer settles each draft
against the tokens decoded after it, fed or not."""

from __future__ import annotations

import pytest

from mutor.generation import DraftPolicy, DraftSettings, FixedDraft
from mutor.generation.policy import RowCosts
from mutor.generation.proposer import Outcome, RegisterProposer


@pytest.mark.parametrize("field,value", [("memory", 0.0), ("revisit", 0.5), ("optimism", -1.0), ("explore", 1.0),
                                         ("smoothing", 0.0), ("level_gains", (1.0,)), ("level_gains", ()),
                                         ("level_gains", 0.3), ("spike", 1.0), ("trust", 0), ("doubt", -1.0),
                                         ("margin", -0.1), ("clock", "gpu"), ("trials", -1.0)])
def test_settings_out_of_range_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"DraftSettings.{field} must be"):
        DraftSettings(**{field: value})


def test_a_draft_length_below_one_is_refused():
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            DraftPolicy(bad)
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            FixedDraft(bad)


def _learn(policy: DraftPolicy, kept: float, cost, rounds: int = 400) -> None:
    """``rounds`` of steady decoding: each round's draft of k_max - 1 tokens keeps its first ``kept`` share,
    and each row count in 1..k_max^2 is timed at ``cost(rows)``."""
    k = policy.k_max
    for _ in range(rounds):
        policy.observe(k - 1, int(kept * (k - 1)))
        for rows in range(1, k * k + 1):
            policy.record(rows, cost(rows))


def test_drafts_kept_and_rows_cheap_draft_long():
    policy = DraftPolicy(4)
    _learn(policy, 1.0, lambda rows: 1.0 + 0.01 * rows)
    assert policy.best()[0] == 4
    assert policy.acceptance.estimate(2) > 0.95


def test_drafts_rejected_decode_plainly():
    policy = DraftPolicy(4)
    _learn(policy, 0.0, lambda rows: 1.0 + 0.01 * rows)
    assert policy.best() == (1, False)
    assert policy.acceptance.estimate(2) < 0.05


def test_rows_that_cost_in_proportion_decode_plainly_even_with_good_drafts():
    policy = DraftPolicy(4)
    _learn(policy, 1.0, lambda rows: float(rows))
    assert policy.best() == (1, False)


def test_a_row_count_not_measured_costs_the_most_of_the_fewer_rows_measured():
    costs = RowCosts(DraftSettings())
    for rows, seconds in ((1, 1.0), (2, 3.0), (4, 2.0)):
        for _ in range(5):
            costs.record(rows, seconds)
    assert costs.seconds(3) == pytest.approx(costs.seconds(2))
    assert costs.seconds(9) == pytest.approx(max(costs.seconds(r) for r in (1, 2, 4)))
    assert RowCosts(DraftSettings()).seconds(1) == float("inf")


def test_counts_of_rows_not_yet_trusted_are_out_of_reach_while_trying_them_is_not_open():
    costs = RowCosts(DraftSettings(trust=3))
    for rows, times in ((1, 5), (2, 3), (4, 1)):          # 1 and 2 rows trusted, 4 timed once
        for _ in range(times):
            costs.record(rows, 1.0 + rows)
    costs.open = False
    assert costs.seconds(1) < float("inf") and costs.seconds(2) < float("inf")
    assert costs.seconds(4) == float("inf") and costs.seconds(9) == float("inf")
    costs.open = True
    assert costs.seconds(4) < float("inf") and costs.seconds(9) < float("inf")


@pytest.mark.parametrize("spread", [0.0, 0.3])
def test_a_count_timed_once_above_the_bound_is_priced_as_timed_only_where_timings_are_steady(spread):
    import random

    rng, costs = random.Random(0), RowCosts(DraftSettings(trust=3, doubt=2.0))
    for _ in range(40):                                   # plain forwards, steady or spread by exp(N(0, spread))
        costs.record(1, rng.lognormvariate(0, spread))
    costs.record(16, 2.4)                                 # one forward of a dear count: 2.4x a plain one
    bound = costs.seconds(1)
    if spread == 0:                                       # steady: one timing rules it out
        assert costs.seconds(16) == pytest.approx(2.4)
    else:                                                 # noisy: 2.4x is within two spreads of the bound
        assert bound <= costs.seconds(16) < 2.4 * 0.75


def _reference_seconds(costs: RowCosts, rows: int, optimistic: bool) -> float:
    """The cost of a forward by its rows as the policy defines it, written out recursively: a measured count's own
    estimate (``optimistic``: ``optimism`` noise-widths low over the root of its discounted count), while measured
    fewer than ``trust`` times at most the most a count with fewer rows costs, unless that estimate ``doubt``
    noise-widths low over the root of its measurements is more; an unmeasured count, that most."""
    import math

    s = costs.settings
    least = max((_reference_seconds(costs, r, optimistic) for r in costs.ratio if r < rows), default=math.inf)
    if rows not in costs.ratio:
        return least
    c = math.exp(costs.level + costs.ratio[rows])
    noise = math.sqrt(costs.square_error) if costs.errors else math.log(s.spike) / 2
    if optimistic:
        c *= math.exp(-s.optimism * noise / math.sqrt(costs.count[rows] + 1))
    if costs.measured[rows] >= s.trust:
        return c
    return min(c, max(least, c * math.exp(-s.doubt * noise / math.sqrt(costs.measured[rows]))))


def test_row_costs_follow_their_definition_over_many_row_counts_and_measurements():
    import random

    rng, costs = random.Random(0), RowCosts(DraftSettings(trust=3))
    for step in range(300):                               # 12 row counts, some measured fewer than trust times
        rows = rng.choice([1, 2, 3, 4, 5, 7, 9, 10, 12, 13, 16, 25] if step % 7 else [2, 3, 9])
        costs.record(rows, 0.05 * (1 + 0.1 * rows) * rng.lognormvariate(0, 0.2))
        if step % 5 == 0:
            costs.forget()
        for r in (1, 6, 9, 16, 30):
            for optimistic in (False, True):
                assert costs.seconds(r, optimistic) == pytest.approx(_reference_seconds(costs, r, optimistic))


def test_a_draft_not_fed_is_settled_by_the_tokens_decoded_after_it():
    seen = []

    class Watching(FixedDraft):
        def observe(self, drafted, kept, first=False):
            seen.append((drafted, kept, first))

    proposer = RegisterProposer(Watching(1))                # plain decoding: no draft is ever fed
    proposer.draft, proposer.first = [7, 8, 9], True
    proposal = proposer.propose(room=10, eos=set())
    assert proposal.draft == [] and proposal.registers == 0
    proposer.update(proposal, Outcome(0, [7], [], None, 1, 1.0))    # x = 7: the draft's first token is right
    assert seen == []
    proposer.update(proposer.propose(10, set()), Outcome(0, [8], [], None, 1, 1.0))
    proposer.update(proposer.propose(10, set()), Outcome(0, [5], [], None, 1, 1.0))   # its third is wrong
    assert seen == [(3, 2, True)]


def test_an_offset_drafts_reached_only_as_an_answers_end_adds_no_tokens():
    policy = DraftPolicy(4)
    for _ in range(20):                                    # answers of a few tokens: each draft is one right
        policy.observe(1, 1, ended=True)                   # token, then the eos it foresaw
    acceptance = policy.acceptance
    assert acceptance.estimate(2) > 0.9 and acceptance.estimate(3) == 0.0
    assert acceptance.expected(4)[0] == pytest.approx(acceptance.expected(2)[0])
    assert acceptance.estimate(3, optimistic=True) > 0.5   # still worth exploring
    policy.observe(2, 2)                                   # a draft checked at offset 3: its estimate counts
    assert acceptance.estimate(3) > 0.5


def _drafting_policy() -> DraftPolicy:
    """A policy that has learned to draft long: drafts kept, rows nearly free."""
    policy = DraftPolicy(4)
    _learn(policy, 1.0, lambda rows: 1.0 + 0.01 * rows)
    return policy


def test_the_answers_last_round_feeds_a_draft_likely_kept_without_registers():
    assert _drafting_policy().plan(1, ends=True) == (1, 0, False)     # kept, it ends the answer: nothing after
    assert _drafting_policy().plan(0, ends=True) == (0, 0, False)     # no draft, the eos next: no register


def test_the_answers_last_round_feeds_registers_where_its_draft_is_likely_rejected():
    policy = _drafting_policy()
    for _ in range(50):                                    # the prompt's registers draft wrong
        policy.observe(3, 0, first=True)
    j, registers, tail = policy.plan(2, first=True, ends=True)
    assert registers > 0                                   # a rejection leaves the next round a draft


def test_an_eos_foreseen_earlier_stops_registers_before_the_answers_end():
    eos = 9
    foreseeing = RegisterProposer(_drafting_policy())
    foreseeing.draft = [5, eos]                           # the registers foresee: 5, then the end
    proposal = foreseeing.propose(room=10, eos={eos})
    foreseeing.update(proposal, Outcome(0, [5], [], None, 2, 1.0))    # 5 decoded; no draft for the next round
    assert foreseeing.propose(room=10, eos={eos}).registers == 0     # the eos is next: registers would draft it
    unaware = RegisterProposer(_drafting_policy())
    assert unaware.propose(room=10, eos={eos}).registers > 0


def _dear_rows(prompts: int = 20, answer: int = 12) -> dict:
    """A trace set whose drafts are always right, for a model whose every extra row costs 0.67 of a forward (as a
    262k-token vocabulary's logits do on a CPU): no draft pays, however good."""
    eos, traces = 2, []
    for i in range(prompts):
        ans = [10 + (i + j) % 40 for j in range(answer)] + [eos]
        traces.append({"prompt_len": 30, "answer": ans,
                       "drafts": [(ans[j + 1:j + 4] + [0, 0, 0])[:3] for j in range(len(ans))]})
    return {"eos": [eos], "max_new_tokens": 64, "d_max": 4, "traces": traces}


def test_trying_counts_of_rows_where_every_row_is_dear_loses_at_most_its_trials():
    from mutor.generation.replay import compare

    plain = 0.1
    costs = {0: 3 * plain, **{r: plain * (1 + 0.67 * (r - 1)) for r in range(1, 17)}}
    lost = {}
    for trials in (6.0, 1e9):                              # the default, and trying every count as long as it takes
        settings = DraftSettings(trials=trials, doubt=100.0)    # timed `trust` times before it is ruled out
        out = compare(_dear_rows(), costs, {"auto": lambda s=settings: DraftPolicy(4, s)}, noise=0.05)
        lost[trials] = out["auto"]["seconds"] - out["K=1"]["seconds"]
    largest_trial = costs[16] - plain                      # one trial may start just above the limit
    assert lost[6.0] <= 6 * plain + largest_trial + 0.005 * out["K=1"]["seconds"], lost
    assert lost[6.0] < 0.5 * lost[1e9], lost
    steady = compare(_dear_rows(), costs, {"auto": lambda: DraftPolicy(4)}, noise=0.05)   # one timing rules out
    assert steady["auto"]["seconds"] - steady["K=1"]["seconds"] < 0.5 * lost[6.0]      # a count 2 spreads dearer


@pytest.mark.parametrize("room, registers", [(1, 0), (2, 1), (3, 2), (10, 3)])
def test_the_prompts_registers_draft_no_more_than_the_next_round_may_feed(room, registers):
    # the round after the prompt's emits one token more than it feeds: room - 1 drafted tokens at most
    for policy in (FixedDraft(4), _drafting_policy()):
        assert RegisterProposer(policy).propose(room, set(), prompt=True).registers == registers


def test_the_kept_choice_is_the_one_computed_afresh():
    import copy
    import random

    rng = random.Random(0)
    policy = DraftPolicy(4)
    for step in range(300):                                # costs, drafts and prompts in a random order
        event = rng.random()
        if event < 0.4:
            policy.record(rng.choice([1, 2, 3, 4, 5, 7, 9, 16]), 0.05 * rng.lognormvariate(0, 0.3),
                          tokens=rng.randint(1, 3))
        elif event < 0.5:
            policy.record(20, 0.1, prompt=True)
        else:
            policy.observe(3, rng.randint(0, 3), first=event < 0.6)
        afresh = copy.deepcopy(policy)
        afresh._steady = afresh._hope = None               # what the same estimates give when computed again
        assert (policy.best(), policy.best(explore=True)) == (afresh.best(), afresh.best(explore=True))
        assert (policy._steady, policy._hope) == (afresh._steady, afresh._hope)   # the choices and the pace
