"""``mutor.generate``: the drafting loop without ``generate`` around it. Lossless against plain greedy
``generate`` on several families, exact acceptance counts on a hand-built case, a draft cut before its eos, tail
rounds, a cache that never keeps register entries, the policy's clock, and speculative sampling that follows
the model's own distribution (chi-square)."""

from __future__ import annotations

import time

import pytest
import torch
from families import VOCAB, make_model
from planted import plant
from references import drafting_round

import mutor.generation.forward as forward
from mutor import MuToRConfig, MuToRModel
from mutor.generation import DraftPolicy, DraftSettings, DraftStats, FixedDraft, generate

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
        got, stats = generate(model, ids, max_new_tokens=24, draft_registers=k, eos_token_id=[])
        assert torch.equal(got, _greedy(base, ids, 24)), f"{family} window={window} K={k} seed={seed}"
        assert stats.new_tokens == 24
        if k == 1:
            assert stats.forwards == 24 and not stats.offered


@pytest.mark.parametrize("family,window", CASES)
def test_a_float32_round_projects_as_one_product_giving_the_models_own_logits(family, window):
    model = MuToRModel(make_model(family, window=window), MuToRConfig(d_max=4))
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)
    assert forward.head_product(model) is not None
    with torch.no_grad():
        prompt = _prompt(3)[0].tolist()
        mine, own = (drafting_round(model, h, prompt, [5, 9, 11]) for h in ("product", "own"))   # (rows, V)
    assert mine.shape == own.shape == (1 + 3 + 4 + 4 * 3, VOCAB)
    torch.testing.assert_close(mine, own, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["bfloat16", "granite", "cohere"])
def test_bfloat16_and_scaled_logits_keep_the_models_own_head(case):
    from families import make_family

    base = make_model("llama").to(torch.bfloat16) if case == "bfloat16" else make_family(case)
    model = MuToRModel(base, MuToRConfig(d_max=4))
    assert forward.head_product(model) is None
    ids = _prompt(1)
    got, _ = generate(model, ids, max_new_tokens=12, draft_registers=3, eos_token_id=[])
    assert torch.equal(got, _greedy(base, ids, 12))


@pytest.mark.usefixtures("model_head")
def test_eos_stops_as_generate_does():
    base = make_model("llama")
    ids = _prompt(3)
    ref = _greedy(base, ids, 30)[0, ids.shape[1]:].tolist()
    eos = ref[5]                                   # a token the greedy continuation produces: stop right after it
    got, stats = generate(MuToRModel(base, MuToRConfig(d_max=3)), ids, max_new_tokens=30, eos_token_id=eos)
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
@pytest.mark.usefixtures("model_head")
def test_acceptance_counts_on_a_hand_built_case(wrong, forwards, offered, accepted):
    base, ids, target, model = _oracle(13, wrong)                  # target: prompt + the 13 greedy tokens
    assert 0 not in target[ids.shape[1]:]                          # the planted wrong token is never right
    got, stats = generate(model, ids, max_new_tokens=13, draft_registers=4, eos_token_id=[])
    assert got[0].tolist() == target
    assert (stats.forwards, stats.offered, stats.accepted) == (forwards, offered, accepted)
    assert stats.tokens_per_forward == pytest.approx(13 / forwards)


@pytest.mark.usefixtures("model_head")
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
    got, stats = generate(model, ids, max_new_tokens=13, draft_registers=4, eos_token_id=eos)
    assert got[0].tolist() == target[:n + 6]
    assert rows == [n + 3, 4 + 12, 1]
    assert (stats.offered, stats.accepted) == ({2: 1, 3: 1, 4: 1}, {2: 1, 3: 1, 4: 1})


class _Always(FixedDraft):
    """A policy that always feeds its whole draft (at most K-1 tokens) with K-1 registers after the last fed token
    only (``tail``)."""

    def plan(self, drafted: int, first: bool = False, ends: bool = False) -> tuple[int, int, bool]:
        return min(drafted, self.k_max - 1), self.k_max - 1, True


@pytest.mark.parametrize("wrong,rows", [
    (None, [7, 7, 4]),                  # oracle: 4 tokens per round; the last round (room for 3) needs no register
    (3, [7, 4, 7, 4, 7, 4, 3, 1]),      # d=3 wrong: a round keeps 1 draft, and the next has none (1 token + 3
])                                      # registers); then room for 2 (no register) and for 0
@pytest.mark.usefixtures("model_head")
def test_tail_rounds_are_lossless_and_feed_registers_after_the_last_token_only(wrong, rows):
    base, ids, target, model = _oracle(13, wrong)
    fed, planted = [], base.forward

    def counting(*args, inputs_embeds=None, **kw):
        fed.append(inputs_embeds.shape[1])
        return planted(*args, inputs_embeds=inputs_embeds, **kw)

    base.forward = counting
    got, stats = generate(model, ids, max_new_tokens=13, draft_registers=_Always(4), eos_token_id=[])
    assert got[0].tolist() == target
    assert fed == [ids.shape[1] + 3] + rows


def test_cache_keeps_no_register_entries(monkeypatch):
    caches = []

    class Spy(forward.DynamicCache):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            caches.append(self)

    monkeypatch.setattr(forward, "DynamicCache", Spy)
    base = make_model("qwen3", window=3)
    model = MuToRModel(base, MuToRConfig(d_max=4))
    ids = _prompt(5)
    got, stats = generate(model, ids, max_new_tokens=17, eos_token_id=[])
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
    got, _ = generate(str(tmp_path), ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(got, _greedy(base, ids, 12))
    with pytest.raises(ValueError, match="no trained per-offset register"):
        generate(model, ids, max_new_tokens=4, draft_registers=5)


def test_bad_input_is_refused():
    model = MuToRModel(make_model("llama"), MuToRConfig(d_max=3))
    with pytest.raises(ValueError, match="batch size 1"):
        generate(model, torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_registers"):
        generate(model, _prompt(), draft_registers=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, _prompt(), max_new_tokens=0)
    img = MuToRModel(make_model("llama"), MuToRConfig(d_max_2d=2, grid_width=4))
    with pytest.raises(ValueError, match="2D offsets"):
        generate(img, _prompt())
    with pytest.raises(TypeError, match="MuToRModel"):
        generate(make_model("llama"), _prompt())


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_bidirectional_prefix_decoding_is_lossless(family):
    """A run trained with a bidirectional prefix is evaluated with it (eval.generation); drafting keeps that."""
    from mutor.eval.generation import greedy_generate

    base = make_model(family, window=3 if family == "gemma3" else None)
    model = MuToRModel(base, MuToRConfig(d_max=3, prefix_attention="bidirectional"))
    ids = _prompt(7, n=9)
    ref = greedy_generate(base, ids.tolist(), 15, pad_id=0, eos_id=None, prefix_attention="bidirectional")[0]
    got, _ = generate(model, ids, max_new_tokens=15, eos_token_id=[])
    assert got[0, 9:].tolist() == ref
    causal, _ = generate(model, ids, max_new_tokens=15, eos_token_id=[], prefix_attention="causal")
    assert torch.equal(causal, _greedy(base, ids, 15))


@pytest.mark.usefixtures("model_head")
def test_auto_drafts_long_with_oracle_registers_and_stays_lossless():
    """Registers that are always right, forwards priced by the tests' cost model (conftest: a few extra rows cost
    little beside a forward): ``auto`` drafts, more than two tokens a forward on average, and stays lossless."""
    base, ids, target, model = _oracle(40)
    got, stats = generate(model, ids, max_new_tokens=40, draft_registers="auto", eos_token_id=[])
    assert got[0].tolist() == target
    assert sum(stats.rounds.values()) == stats.forwards and stats.forwards < 20


@pytest.mark.wall_clock
@pytest.mark.parametrize("clock, ticking", [("wall", "perf_counter"), ("cpu", "thread_time")])
def test_generate_times_its_forwards_by_the_policys_clock(monkeypatch, clock, ticking):
    """Every timed forward is recorded as a difference of the clock the settings name (a fake one here, 1 s a
    tick)."""
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(time, ticking, lambda: float(next(ticks)))
    told = []
    policy = DraftPolicy(3, DraftSettings(clock=clock))
    record = policy.record
    policy.record = lambda rows, seconds, prompt=False, tokens=1: (told.append(seconds),
                                                               record(rows, seconds, prompt, tokens))
    generate(MuToRModel(make_model("llama"), MuToRConfig(d_max=3)), _prompt(1), max_new_tokens=8,
             draft_registers=policy, eos_token_id=[])
    assert told and all(s == 1.0 for s in told)


def test_an_unknown_clock_is_refused_by_name():
    with pytest.raises(ValueError, match="clock must be 'wall' or 'cpu', not 'gpu'"):
        DraftSettings(clock="gpu")


def test_a_draft_policy_carries_what_it_learned_across_prompts():
    base = make_model("llama")
    model = MuToRModel(base, MuToRConfig(d_max=3))
    policy = DraftPolicy(3)
    seen = []
    for seed in (1, 2, 3, 4):
        ids = _prompt(seed)
        got, stats = generate(model, ids, max_new_tokens=4, draft_registers=policy, eos_token_id=[])
        assert torch.equal(got, _greedy(base, ids, 4))
        seen.append(dict(policy.costs.measured))
    # the first prompt prices a plain round and checks the prompt's draft in the shadow; later prompts go on from there
    assert 1 in seen[0] and policy.first.checked[2] > 0
    assert all(all(b.get(r, 0) >= n for r, n in a.items()) for a, b in zip(seen, seen[1:]))


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


def _draws(model, ids, temperature: float, n: int, eos=None) -> tuple[torch.Tensor, DraftStats]:
    """(V, V) counts of the first two tokens over ``n`` sampled continuations with drafts, and their stats
    (after an ``eos`` first token, the pair (eos, eos))."""
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.long)
    total = DraftStats()
    for _ in range(n):
        out, st = generate(model, ids, max_new_tokens=3, draft_registers=3, do_sample=True,
                                eos_token_id=[] if eos is None else eos,
                                temperature=temperature, generator=gen)   # 3: a draft for the 2nd token is verified
        a, b = (out[0, ids.shape[1]:].tolist() + [eos])[:2]
        counts[a, b] += 1
        total.add(st)
    return counts, total


@pytest.mark.usefixtures("model_head")
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
    got, stats = generate(model, _prompt(), max_new_tokens=5, draft_registers=1, do_sample=True,
                               generator=torch.Generator().manual_seed(1), eos_token_id=[])
    assert got.shape[1] == _prompt().shape[1] + 5 and stats.forwards == 5
    with pytest.raises(ValueError, match="temperature"):
        generate(model, _prompt(), do_sample=True, temperature=0)
