"""Self-speculative decoding with registers: lossless against plain greedy `generate`, exact acceptance counts
on a hand-built case, and a cache that never keeps register entries."""

from __future__ import annotations

import time

import pytest
import torch
from families import VOCAB, make_model
from planted import plant

import mutor.integrations.speculative as spec
from mutor import MuToRConfig, MuToRModel

CASES = [("llama", None), ("gpt2", None), ("qwen3", 3), ("gemma2", 3), ("gemma3", 3), ("mistral", 3), ("gemma3", None)]


def _prompt(seed: int = 1, n: int = 7) -> torch.Tensor:
    return torch.randint(3, 61, (1, n), generator=torch.Generator().manual_seed(seed))


def _greedy(base, ids, n):
    with torch.no_grad():
        return base.generate(ids, do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)


@pytest.mark.parametrize("family,window", CASES)
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_greedy_is_lossless_with_untrained_registers(family, window, k):
    base = make_model(family, window=window)
    model = MuToRModel(base, MuToRConfig(d_max=4))
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)
    for seed in (1, 2):
        ids = _prompt(seed)
        got, stats = spec.generate(model, ids, max_new_tokens=24, draft_registers=k, eos_token_id=[])
        assert torch.equal(got, _greedy(base, ids, 24)), f"{family} window={window} K={k} seed={seed}"
        assert stats.new_tokens == 24
        if k == 1:
            assert stats.forwards == 24 and not stats.offered


def test_eos_stops_as_generate_does():
    base = make_model("llama")
    ids = _prompt(3)
    ref = _greedy(base, ids, 30)[0, ids.shape[1]:].tolist()
    eos = ref[5]                                   # a token the greedy continuation produces: stop right after it
    got, stats = spec.generate(MuToRModel(base, MuToRConfig(d_max=3)), ids, max_new_tokens=30, eos_token_id=eos)
    assert got[0, ids.shape[1]:].tolist() == ref[:ref.index(eos) + 1]


def _planted(model: MuToRModel, target: list[int], wrong_offset: int | None, K: int):
    """Make the register rows predict the oracle continuation (``target[p + 1]`` for a register at position p),
    except offset ``wrong_offset``, which predicts a token the model never chooses (K fixed: the registers of
    a fed token come in groups of K-1, offsets 2..K)."""
    plant(model, lambda p, k: 0 if 2 + k % (K - 1) == wrong_offset or p >= len(target) else target[p])


def _oracle(new: int, wrong: int | None = None, seed: int = 4):
    """A llama-family MuToR model (d_max=4) whose registers draft the greedy continuation (``_planted``, offset
    ``wrong`` wrong); returns ``(base, prompt ids, prompt + the new greedy tokens, model)``."""
    base = make_model("llama")
    ids = _prompt(seed)
    target = _greedy(base, ids, new)[0].tolist()
    model = MuToRModel(base, MuToRConfig(d_max=4))
    _planted(model, target, wrong, K=4)
    return base, ids, target, model


@pytest.mark.parametrize("wrong,forwards,offered,accepted", [
    (None, 4, {2: 3, 3: 3, 4: 3}, {2: 3, 3: 3, 4: 3}),     # oracle drafts: 1 token, then 4 per forward
    (3, 7, {2: 6, 3: 5}, {2: 6}),                           # d=3 always wrong: 2 tokens per forward, d=4 never
    (2, 13, {2: 11}, {}),                                   # reached; d=2 wrong: plain greedy speed. The last round
])                                                          # drafts no token past max_new_tokens (room for 1, 0)
def test_acceptance_counts_on_a_hand_built_case(wrong, forwards, offered, accepted):
    base, ids, target, model = _oracle(13, wrong)                  # target: prompt + the 13 greedy tokens
    assert 0 not in target[ids.shape[1]:]                          # the planted wrong token is never right
    got, stats = spec.generate(model, ids, max_new_tokens=13, draft_registers=4, eos_token_id=[])
    assert got[0].tolist() == target
    assert (stats.forwards, stats.offered, stats.accepted) == (forwards, offered, accepted)
    assert stats.tokens_per_forward == pytest.approx(13 / forwards)


def test_a_draft_stops_before_its_eos():
    """A draft is cut before its first eos: when the drafts before it are kept, the model's own next token is that
    eos if the draft was right, so feeding it would only cost a row (and the tokens behind it could never be
    emitted); no register follows the last fed token, since the draft foresees the end there. Oracle drafts,
    K = 4, eos the 6th new token: the prompt's round, one round of 4 tokens, then x_5 alone (1 row, not
    [x_5, eos] + registers), whose next token is the eos; the output is greedy's up to the eos."""
    base, ids, target, model = _oracle(13, seed=5)
    n = ids.shape[1]
    eos = target[n + 5]
    assert eos not in target[n:n + 5]
    rows, planted = [], base.forward

    def counting(*args, inputs_embeds=None, **kw):
        rows.append(inputs_embeds.shape[1])
        return planted(*args, inputs_embeds=inputs_embeds, **kw)

    base.forward = counting
    got, stats = spec.generate(model, ids, max_new_tokens=13, draft_registers=4, eos_token_id=eos)
    assert got[0].tolist() == target[:n + 6]
    assert rows == [n + 3, 4 + 12, 1]
    assert (stats.offered, stats.accepted) == ({2: 1, 3: 1, 4: 1}, {2: 1, 3: 1, 4: 1})


class _Always(spec.DraftLength):
    """A chooser that always takes one draft: ``(k, tail)``."""

    def __init__(self, k: int, tail: bool):
        super().__init__(k)
        self.pick = (k, tail)

    def choose(self, drafted=None, first=False, ends=False):
        return self.pick


@pytest.mark.parametrize("wrong,rows", [
    (None, [7, 7, 4]),                  # oracle: 4 tokens per round; the last round (room for 3) needs no register
    (3, [7, 4, 7, 4, 7, 4, 3, 1]),      # d=3 wrong: a round keeps 1 draft, and the next has none (1 token + 3
])                                      # registers); then room for 2 (no register) and for 0
def test_tail_rounds_are_lossless_and_feed_registers_after_the_last_token_only(wrong, rows):
    base, ids, target, model = _oracle(13, wrong)
    fed, planted = [], base.forward

    def counting(*args, inputs_embeds=None, **kw):
        fed.append(inputs_embeds.shape[1])
        return planted(*args, inputs_embeds=inputs_embeds, **kw)

    base.forward = counting
    got, stats = spec.generate(model, ids, max_new_tokens=13, draft_registers=_Always(4, True), eos_token_id=[])
    assert got[0].tolist() == target
    assert fed == [ids.shape[1] + 3] + rows
    assert stats.tail_rounds == len(rows)


def test_cache_keeps_no_register_entries(monkeypatch):
    caches = []

    class Spy(spec.DynamicCache):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            caches.append(self)

    monkeypatch.setattr(spec, "DynamicCache", Spy)
    base = make_model("qwen3", window=3)
    model = MuToRModel(base, MuToRConfig(d_max=4))
    ids = _prompt(5)
    got, stats = spec.generate(model, ids, max_new_tokens=17, eos_token_id=[])
    (cache,) = caches
    # every kept token but the newest one (never fed) is cached, and nothing else: no register, no rejected draft
    assert cache.get_seq_length() == got.shape[1] - 1
    for layer in cache.layers:
        assert layer.keys.shape[-2] == got.shape[1] - 1


def test_per_offset_registers_and_checkpoint_directory(tmp_path):
    base = make_model("llama")
    model = MuToRModel(base, MuToRConfig(d_max=3, register_embedding="per_offset"))
    model.save_pretrained(tmp_path)
    ids = _prompt(6)
    got, _ = spec.generate(str(tmp_path), ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(got, _greedy(base, ids, 12))
    with pytest.raises(ValueError, match="no trained per-offset register"):
        spec.generate(model, ids, max_new_tokens=4, draft_registers=5)


def test_bad_input_is_refused():
    model = MuToRModel(make_model("llama"), MuToRConfig(d_max=3))
    with pytest.raises(ValueError, match="batch size 1"):
        spec.generate(model, torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_registers"):
        spec.generate(model, _prompt(), draft_registers=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        spec.generate(model, _prompt(), max_new_tokens=0)
    img = MuToRModel(make_model("llama"), MuToRConfig(d_max_2d=2, grid_width=4))
    with pytest.raises(ValueError, match="2D offsets"):
        spec.generate(img, _prompt())
    with pytest.raises(TypeError, match="MuToRModel"):
        spec.generate(make_model("llama"), _prompt())


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_bidirectional_prefix_decoding_is_lossless(family):
    """A run trained with a bidirectional prefix is evaluated with it (eval.generation); drafting keeps that."""
    from mutor.eval.generation import greedy_generate

    base = make_model(family, window=3 if family == "gemma3" else None)
    model = MuToRModel(base, MuToRConfig(d_max=3, prefix_attention="bidirectional"))
    ids = _prompt(7, n=9)
    ref = greedy_generate(base, ids.tolist(), 15, pad_id=0, eos_id=None, prefix_attention="bidirectional")[0]
    got, _ = spec.generate(model, ids, max_new_tokens=15, eos_token_id=[])
    assert got[0, 9:].tolist() == ref
    causal, _ = spec.generate(model, ids, max_new_tokens=15, eos_token_id=[], prefix_attention="causal")
    assert torch.equal(causal, _greedy(base, ids, 15))


def test_benchmark_runs_on_a_saved_star_graph_model(tmp_path):
    """benchmarks.speculative end to end on a tiny saved run: every method decodes the same tokens."""
    from benchmarks.speculative import markdown, measure

    MuToRModel(make_model("llama"), MuToRConfig(d_max=3, min_offset=2)).save_pretrained(tmp_path)
    (tmp_path / "recipe.yaml").write_text("seed: 0\ndata: {task: star_graph, degree: 2, path_len: 3, num_nodes: 20}\n")
    res = measure(str(tmp_path), drafts=[2, 3, "auto"], num_prompts=3, max_new_tokens=None, rounds=1, lookup=2)
    assert [r["method"] for r in res["rows"]] == ["greedy", "prompt_lookup_2", "registers_K2", "registers_K3",
                                                   "registers_Kauto"]
    assert res["max_new_tokens"] == 3 and res["rows"][2]["new_tokens"] == 9
    assert "| registers_K3 |" in markdown(res)
    assert "chooser_state" in res["rows"][4] and "chooser_state" not in res["rows"][3]   # why auto drafted so


def _decode(length, n: int, cost, kept) -> list[tuple[int, bool]]:
    """``n`` rounds as ``generate`` runs them, after a prompt round whose registers drafted: each round feeds the
    pending token, at most k-1 of the pending draft and registers (after each fed token, or the last only),
    costs ``cost(rows)``; of a draft of n tokens the first ``kept(n)`` are right (fed or not: ``watch`` /
    ``emitted``, here in one ``observe``). Returns the choices."""
    picks, draft = [], length.prompt_round() - 1
    for _ in range(n):
        k, tail = length.choose(draft)
        picks.append((k, tail))
        fed = min(k - 1, draft)
        if draft:                                                  # fed or not, settled by the decoded tokens
            length.observe(draft, kept(draft))
        ends = (1 if tail else 1 + fed) if k > 1 else 0          # tokens followed by k-1 registers
        rows = 1 + fed + ends * (k - 1)
        length.record(rows, cost(rows))
        got = kept(fed) if fed else 0
        draft = k - 1 if k > 1 and (not tail or got == fed) else 0
    return picks


def test_draft_length_switches_drafting_off_when_drafts_are_rejected():
    length = spec.DraftLength(4)
    picks = _decode(length, 300, cost=lambda rows: 1.0 + 0.2 * (rows - 1), kept=lambda n: 0)
    assert length.best() == (1, False) and [k for k, _ in picks].count(1) >= 290


def test_probes_back_off_and_take_at_most_their_share_of_the_time():
    """While drafts are rejected, a probe (the pending token and K_max-1 registers) comes ever more rarely, and
    never so often that probes cost more than ``probe_share`` of the decoding time."""
    cost = lambda rows: 1.0 + 0.02 * (rows - 1)                   # cheap rows (bf16-like): probes may be frequent
    picks = _decode(spec.DraftLength(4, probe_share=1.0), 400, cost, kept=lambda n: 0)   # no floor here
    settled = 1 + max(i for i, c in enumerate(picks) if c not in {(1, False), (4, True)})  # drafting tried, given up
    assert settled < 40
    probes = [i for i, c in enumerate(picks) if c == (4, True) and i >= settled]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(gaps) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0]
    for share in (0.01, 0.05):
        cost = lambda rows: 1.0 + 0.5 * (rows > 1)               # one row fast, any more 1.5x (float32-like)
        length = spec.DraftLength(4, probe_share=share)
        picks = _decode(length, 2000, cost, kept=lambda n: 0)
        later = picks[100:]                                        # after the first tries
        extra = sum(cost(4) - cost(1) for c in later if c == (4, True))     # a probe: 4 rows, not 1
        assert length.best() == (1, False) and extra <= share * len(later) * cost(1) * 1.1


def test_where_no_kept_draft_could_pay_the_registers_stay_out_entirely():
    """Rows that cost in proportion: no draft pays even if kept whole. After pricing the cheapest draft and one
    probe, neither probes nor the prompt's registers are fed again."""
    length = spec.DraftLength(4)
    picks = _decode(length, 300, cost=lambda rows: float(rows), kept=lambda n: n)
    assert length.tried == {(1, False), (2, True)}                 # fewest rows first; every larger one ruled out
    assert all(c == (1, False) for c in picks[50:]) and length.prompt_round() == 1


def test_while_plain_decoding_wins_the_prompts_registers_come_on_the_probes_schedule():
    length = spec.DraftLength(4)
    _decode(length, 300, cost=lambda rows: 1.0 + 0.5 * (rows > 1), kept=lambda n: 0)
    assert length.best() == (1, False)
    length.since_probe = 10 ** 6                                   # a probe is due: this prompt's registers are it
    assert length.prompt_round() == 4 and length.prompt_round() == 1


@pytest.mark.parametrize("cost, expected", [
    (lambda rows: 1.0, (4, False)),                 # extra rows are free: the longest draft, registers everywhere
    (lambda rows: float(rows), (1, False)),         # rows cost in full: no draft pays for its rows
    (lambda rows: 1.0 + (rows > 3), (2, True)),     # 1-3 rows cost one, more cost two: a 2-token tail
])                                                  # round (3 rows) beats a full one (4 rows)
def test_draft_length_follows_tokens_per_second_when_every_draft_is_kept(cost, expected):
    length = spec.DraftLength(4)
    _decode(length, 60, cost, kept=lambda n: n)
    assert length.best() == expected


def test_tail_registers_pay_only_while_drafts_are_kept():
    """A tail round of K = 2 (3 rows) beats K = 1 while its draft is kept (2 tokens for 1.2), and loses when every
    draft fails (a drafted round and the draftless round after it, 1.2 + 1.1, for 2 tokens)."""
    cost = lambda rows: 1.0 + 0.1 * (rows - 1) if rows <= 3 else 2.0
    best = {}
    for share in (1, 0):
        length = spec.DraftLength(2, memory=1.0)
        _decode(length, 100, cost, kept=lambda n: min(share, n))
        best[share] = length.best()
    assert best == {1: (2, True), 0: (1, False)}


def test_an_unmeasured_count_is_priced_from_the_measured_ones():
    """Answers shorter than a draft: a full K = 4 round (16 rows) cut at its eos feeds at most 9 rows. 16 rows are
    then priced in proportion to the largest measured, a smaller unmeasured count at most as the next larger
    measured one, and at least as the largest smaller one (the cost an untried draft is tried at)."""
    length = spec.DraftLength(4)
    for rows, sec in ((1, 1.0), (3, 1.2), (9, 2.0)):
        length.record(rows, sec)
    assert length.seconds(16) == pytest.approx(2.0 * 16 / 9) and length.seconds(6) == 2.0
    assert length.least_seconds(6) == 1.2 and length.least_seconds(9) == 2.0 and length.least_seconds(16) == 2.0


def test_measured_costs_need_not_grow_with_the_rows_and_a_load_spike_moves_them_little():
    """float32 on a CPU: 3 rows can cost more than 4. A count's own measurements decide its cost; a count not
    measured costs what the cheapest larger one does; one slow measurement weighs as twice the average at most; a
    count's first measurements are averaged, so that one lucky forward does not stand for its cost. (Each count's
    average alone, ``level_gains=()``; with the default shared speed levels, the spike moves every cost by 1 %.)"""
    shared = spec.DraftLength(2)
    for rows, sec in ((4, 2.0), (3, 2.5), (1, 1.0), (1, 10.0)):
        shared.record(rows, sec)
    assert shared.seconds(4) == pytest.approx(2.0 * 1.01) and shared.seconds(1) == pytest.approx(1.5 * 1.01)
    length = spec.DraftLength(2, level_gains=())
    for rows, sec in ((4, 2.0), (3, 2.5), (1, 1.0)):
        length.record(rows, sec)
    assert length.seconds(3) == 2.5 and length.seconds(2) == 2.0 and length.seconds(1) == 1.0
    length.record(1, 10.0)
    assert length.seconds(1) == pytest.approx(0.5 * 1.0 + 0.5 * 2.0)    # the second measurement: half, capped at 2x
    for _ in range(100):                                                   # the first ones averaged (weight 1/n) ...
        length.record(4, 1.0)
    assert length.seconds(4) == pytest.approx(1.0, abs=1e-3)
    length.record(4, 3.0)                                                  # ... then a running average (smoothing)
    assert length.seconds(4) == pytest.approx(1.0 + length.smoothing * (2.0 - 1.0), abs=1e-3)


@pytest.mark.parametrize("two_rows, expected", [(1.6, (4, True)), (1.2, (2, True))])
def test_a_round_with_no_draft_feeds_the_cheapest_count_of_registers(two_rows, expected):
    """Drafting wins (K=2, d=2 always kept), but the round has no draft (the last one was rejected, or the round
    before was plain): it feeds the pending token and j-1 registers, j rows, whatever K. In float32 on a CPU 4 rows
    can cost less than 2, so it takes the cheapest j >= K: registers for more offsets, for less."""
    length = spec.DraftLength(4)
    for rows, sec in ((1, 1.0), (2, two_rows), (3, 1.7), (4, 1.4), (9, 3.0), (16, 5.0)):
        length.record(rows, sec)
    length.tried.update(length.candidates)
    for _ in range(30):
        length.observe(2, 1)                                       # d=2 kept, d=3 not
    assert length.best() == (2, False)
    assert length.choose(0) == expected
    assert length.choose(1) == (2, False)                          # with a draft: the best K, full


def test_draft_length_stops_at_the_first_offset_that_fails():
    """d=2 always right, d=3 always wrong: a one-token draft. Its first estimates fall short of the bar; the
    probes (about every 90 rounds at these costs: probes stay under 1 % of the time) settle it."""
    length = spec.DraftLength(4)
    picks = [k for k, _ in _decode(length, 400, cost=lambda rows: 1.0 + 0.3 * (rows - 1), kept=lambda n: min(1, n))]
    assert picks[300:].count(2) >= 0.9 * len(picks[300:])


def _every_choice_priced() -> spec.DraftLength:
    """A chooser (K_max=4) that has tried every choice: one row costs 1, any more 1.5."""
    length = spec.DraftLength(4)
    length.tried = set(length.candidates)
    for rows in (1, 3, 4, 5, 7, 9, 16):
        length.record(rows, 1.0 if rows == 1 else 1.5)
    return length


def test_the_prompts_drafts_have_their_own_acceptance():
    """Short answers whose first tokens the prompt's registers miss while later drafts are right (shortest path):
    the misses count apart, and the round after the prompt's takes the in-answer K with registers after every
    fed token, so that the round after it has an in-answer draft although the prompt's draft is rejected."""
    length = _every_choice_priced()
    for _ in range(10):
        length.observe(3, 0, first=True)
        length.observe(3, 3)
    assert length.best(first=True) == (1, False) and length.best() == (4, False)
    assert length.choose(3, first=True) == (4, False) and length.choose(3) == (4, False)
    length.watch([5, 6], first=True)
    length.emitted([5, 6])
    assert length.first_accepted[2] > 0 and length.first_offered[4] == 0


def test_a_prompt_draft_that_is_mostly_right_still_decides_the_round_after_the_prompts():
    """Prompt drafts right at every offset, in-answer drafts right at d=2 only: the round after the prompt's
    feeds the prompt's whole draft (its own best), not the shorter in-answer K."""
    length = _every_choice_priced()
    for _ in range(10):
        length.observe(3, 3, first=True)
        length.observe(3, 1)
    assert length.best()[0] in (2, 3) and length.best(first=True) == (4, False)
    assert length.choose(3, first=True) == (4, False)


def test_the_prompts_registers_are_fed_for_in_answer_drafting_only_where_their_draft_pays_for_their_rows():
    """In-answer drafts right, the prompt's drafts wrong (shortest path's short answers): the prompt's registers
    are fed where their draft's expected tokens pay for their rows in the prompt's forward (priced by its measured
    seconds per row) and, so that their acceptance is checked again, every ``max_probe`` prompts; without them
    the round after feeds one token and j-1 registers (the cheapest j >= the in-answer K), starting the in-answer
    draft."""
    def primed(prompt_row):
        length = _every_choice_priced()
        for _ in range(10):
            length.observe(3, 0, first=True)
            length.observe(3, 3)
        length.record_prompt(100, 100 * prompt_row)
        return length

    dear = primed(0.1)           # 3 registers: 0.3 s and a 16-row round, for ~0.15 tokens at 4 / 1.5 s a token
    assert dear.best() == (4, False) and dear.best(first=True) == (1, False)
    assert dear.prompt_round() == 1 and dear.choose(0, first=True) == (4, True)
    assert [dear.prompt_round() for _ in range(dear.max_probe)].count(4) == 1
    assert primed(0.01).prompt_round() == 4                       # 0.03 s: the draft pays


def test_the_prompts_registers_reach_one_offset_beyond_the_winning_draft():
    """A 2-token draft of the answer's start wins and nothing within the answer does: the prompt's forward feeds
    the registers for offsets 2 and 3 (K = 3), not all K_max - 1 of them, and all of them every ``max_probe``
    prompts, so that the deeper offsets are checked again."""
    length = spec.DraftLength(4)
    length.tried = set(length.candidates)
    for rows, seconds in {1: 1.0, 3: 1.3, 4: 1.4, 5: 1.6, 7: 1.9, 9: 2.2, 16: 3.0}.items():
        length.record(rows, seconds)
    for _ in range(10):
        length.observe(3, 1, first=True)                          # the answer's start: d=2 kept, d=3 not
        length.observe(3, 0)                                      # within the answer: nothing kept
    assert length.best(first=True)[0] == 2 and length.best() == (1, False)
    ks = [length.prompt_round() for _ in range(length.max_probe)]
    assert ks.count(4) == 1 and ks.count(3) == length.max_probe - 1


def test_a_draft_that_reaches_the_end_is_fed_only_where_this_round_pays():
    """The last round of a short answer: its j drafts stop before the eos the registers foresaw, and the j
    registers after the last of them are still fed (``generate``'s rows, as the replay's): 2j + 1 rows, or (j+1)^2
    with registers after every fed token where those cost less. float32-like costs and drafts right 80 % of the
    time: 1.8 tokens pay at 1.2 for 3 rows, or at 1.5 for 4 rows, not at 1.9 for either, whatever 2 rows cost;
    a draft that does not reach the end is still priced as usual."""
    for c3, c4, expected in ((1.2, 1.5, (2, True)), (1.9, 1.5, (2, False)), (1.9, 1.9, (1, False))):
        length = spec.DraftLength(4)
        length.tried = set(length.candidates)
        for rows, sec in ((1, 1.0), (2, 1.2), (3, c3), (4, c4)):
            length.record(rows, sec)
        for _ in range(10):
            length.observe(1, 1)
            length.observe(1, 0) if _ % 5 == 0 else None
        assert length.choose(1, ends=True) == expected
        if c4 == 1.5:
            assert length.choose(1) != (1, False)                  # drafting pays within the answer


def test_watched_drafts_are_settled_by_the_tokens_decoded_after_them():
    length = spec.DraftLength(4, memory=1.0)
    length.watch([5, 6, 7])
    length.emitted([5])
    length.watch([8, 9, 1])                                        # a second draft, one token later
    length.emitted([6, 8])                                         # first: d=2, 3 kept, d=4 rejected; second: d=2 rejected
    assert length.offered[2:] == [2, 1, 1] and length.accepted[2:] == [1, 1, 0] and not length.watched
    length.watch([5, 6, 7])
    length.emitted([5])
    length.flush()                                                 # decoding ended: only d=2 was checked
    assert length.offered[2:] == [3, 1, 1] and length.accepted[2:] == [2, 1, 0]


class _Plain(spec.DraftLength):
    """A chooser that registers after the prompt but never feeds a draft."""

    def choose(self, drafted=None, first=False, ends=False):
        return 1, False


@pytest.mark.parametrize("wrong,offered,accepted", [(None, [1, 1, 1], [1, 1, 1]), (3, [1, 1, 0], [1, 0, 0])])
def test_the_prompts_draft_is_checked_in_the_shadow_by_plain_rounds(wrong, offered, accepted):
    base, ids, target, model = _oracle(13, wrong)
    length = _Plain(4)
    got, stats = spec.generate(model, ids, max_new_tokens=13, draft_registers=length, eos_token_id=[])
    assert got[0].tolist() == target and stats.forwards == 13 and stats.offered == {}
    assert length.first_offered[2:] == offered and length.first_accepted[2:] == accepted


def test_auto_drafts_long_with_oracle_registers_and_stays_lossless():
    base, ids, target, model = _oracle(40)
    got, stats = spec.generate(model, ids, max_new_tokens=40, draft_registers="auto", eos_token_id=[])
    assert got[0].tolist() == target
    assert sum(stats.rounds.values()) == stats.forwards and stats.forwards < 40


@pytest.mark.parametrize("clock, expected", [(None, time.perf_counter), ("wall", time.perf_counter),
                                             ("cpu", time.thread_time)])
def test_the_chooser_times_forwards_by_the_clock_it_names(clock, expected):
    length = spec.DraftLength(4) if clock is None else spec.DraftLength(4, clock=clock)
    assert length.timer() is expected


def test_generate_times_its_forwards_by_the_choosers_clock():
    """Every timed forward is recorded as a difference of the chooser's clock (a fake one here, 1 s per tick)."""
    class Ticking(spec.DraftLength):
        def timer(self):
            ticks = iter(range(10 ** 6))
            return lambda: float(next(ticks))

    base = make_model("llama")
    length = Ticking(3)
    spec.generate(MuToRModel(base, MuToRConfig(d_max=3)), _prompt(1), max_new_tokens=8, draft_registers=length,
                  eos_token_id=[])
    assert length.cost and all(c == 1.0 for c in length.cost.values())


def test_an_unknown_clock_is_refused_by_name():
    with pytest.raises(ValueError, match="clock must be one of wall, cpu, not 'gpu'"):
        spec.DraftLength(4, clock="gpu")


def test_a_probe_share_of_zero_is_refused_by_name():
    with pytest.raises(ValueError, match="probe_share must be > 0, not 0"):
        spec.DraftLength(4, probe_share=0)


def test_a_draft_length_chooser_carries_what_it_learned_across_prompts():
    base = make_model("llama")
    model = MuToRModel(base, MuToRConfig(d_max=3))
    length = spec.DraftLength(3)
    seen = []
    for seed in (1, 2, 3, 4):
        ids = _prompt(seed)
        got, stats = spec.generate(model, ids, max_new_tokens=4, draft_registers=length, eos_token_id=[])
        assert torch.equal(got, _greedy(base, ids, 4))
        seen.append((set(length.cost), set(length.tried)))
    # the first prompt prices a plain round and checks the prompt's draft in the shadow; later prompts go on from there
    assert 1 in seen[0][0] and length.first_offered[2] > 0
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(seen, seen[1:]))


def _chi2_upper(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at the standard normal quantile ``z``
    (3.09: the 0.999 quantile)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _two_token_distribution(base, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """(V, V) exact probability of the first two sampled tokens under plain sampling at ``temperature``."""
    with torch.no_grad():
        p1 = torch.softmax(base(ids).logits[0, -1].double() / temperature, -1)          # (V,)
        V = p1.numel()
        both = torch.cat([ids.repeat(V, 1), torch.arange(V)[:, None]], 1)              # (V, n+1)
        p2 = torch.softmax(base(both).logits[:, -1].double() / temperature, -1)        # (V, V)
    return p1[:, None] * p2


def _chi2(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, int]:
    expected = n * probs.flatten()
    big = expected >= 5
    obs, exp = counts.flatten()[big].double(), expected[big]
    rest_obs, rest_exp = counts.flatten()[~big].sum().double(), expected[~big].sum()
    stat = float(((obs - exp) ** 2 / exp).sum() + ((rest_obs - rest_exp) ** 2 / rest_exp if rest_exp > 0 else 0))
    return stat, int(big.sum()) + (1 if rest_exp > 0 else 0) - 1


def _draws(model, ids, temperature: float, n: int, eos=None) -> tuple[torch.Tensor, "spec.DraftStats"]:
    """(V, V) counts of the first two tokens over ``n`` sampled continuations with drafts, and their stats
    (after an ``eos`` first token, the pair (eos, eos))."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.long)
    total = spec.DraftStats()
    for _ in range(n):
        out, st = spec.generate(model, ids, max_new_tokens=3, draft_registers=3, do_sample=True,
                                eos_token_id=[] if eos is None else eos,
                                temperature=temperature, generator=gen)   # 3: a draft for the 2nd token is verified
        a, b = (out[0, ids.shape[1]:].tolist() + [eos])[:2]
        counts[a, b] += 1
        total.add(st)
    return counts, total


@pytest.mark.parametrize("with_eos", [False, True])
def test_speculative_sampling_draws_from_the_models_own_distribution(with_eos):
    """Sampling with drafts (accept with min(1, p/q), else the residual): the first two tokens follow the
    model's exact two-token distribution (chi-square at the 0.999 level), while drafts are both kept and
    rejected; the same samples are refused against the distribution at another temperature (the test has power).
    ``with_eos``: half the drafts are the eos, so drafts end at an eos, which, unlike in greedy decoding, is
    verified rather than dropped: dropping a draft for its value biases the output (that variant fails here,
    statistic 101 against the limit 44)."""
    base = make_model("llama")
    model = MuToRModel(base, MuToRConfig(d_max=3))
    ids = _prompt(7, n=5)
    T, n = 0.05, 800
    exact = _two_token_distribution(base, ids, T)
    # the register drafts x_{e+2} from x_<=e: plant the best such draft, the marginal of the second token
    # (close to p after x_{e+1} but not equal, so drafts are both kept and rejected)
    q = exact.sum(0).float()                                                            # (V,)
    eos = int(q.argmax()) if with_eos else None
    if with_eos:                                 # decoding stops after an eos first token: its row is one outcome
        exact[eos, eos], exact[eos, :eos], exact[eos, eos + 1:] = exact[eos].sum(), 0, 0
        q = 0.5 * q + 0.5 * torch.nn.functional.one_hot(torch.tensor(eos), VOCAB)   # half the drafts an eos
    plant(model, lambda p, k: T * q.clamp(min=1e-30).log())                          # softmax(./T) = q
    counts, total = _draws(model, ids, T, n, eos)
    assert 0.05 < total.accepted.get(2, 0) / total.offered[2] < 0.95      # drafts kept and rejected
    stat, df = _chi2(counts, exact, n)
    assert df >= 10 and stat < _chi2_upper(df), (stat, df)
    stat, df = _chi2(counts, _two_token_distribution(base, ids, 0.08), n)
    assert stat > _chi2_upper(df), (stat, df)


def test_sampling_without_drafts_and_bad_temperature():
    base = make_model("llama")
    model = MuToRModel(base, MuToRConfig(d_max=3))
    got, stats = spec.generate(model, _prompt(), max_new_tokens=5, draft_registers=1, do_sample=True,
                               generator=torch.Generator().manual_seed(1), eos_token_id=[])
    assert got.shape[1] == _prompt().shape[1] + 5 and stats.forwards == 5
    with pytest.raises(ValueError, match="temperature"):
        spec.generate(model, _prompt(), do_sample=True, temperature=0)
