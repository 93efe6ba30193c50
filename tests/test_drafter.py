"""``model.generate(..., custom_generate=RegisterDrafter)``: transformers' own generate with the registers drafting.

Lossless against plain ``generate`` (greedy, float32) on several families and sliding windows, with drafts right
and wrong; a bidirectional-prefix run decodes with the prompt attention its sidecar records, as ``mutor eval``
does; a fixed K drafts wherever a draft can save a forward; logits processors, eos, stopping criteria, a streamer and
``return_dict_in_generate`` as ``generate`` honours them; speculative sampling with temperature and top-k
follows the model's own distribution (chi-square); and what the drafter does not do is refused in one line.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from families import VOCAB, make_model
from planted import plant
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from mutor import MuToRConfig, MuToRModel, RegisterDrafter, generate

pytestmark = pytest.mark.usefixtures("model_head")      # planted registers (``planted.plant``)


def _prompt(seed: int = 1, n: int = 7) -> torch.Tensor:
    return torch.randint(3, 61, (1, n), generator=torch.Generator().manual_seed(seed))


def _plain(base, ids, n, **kw):
    with torch.no_grad():
        return base.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)


def _oracle(family: str = "llama", new: int = 20, seed: int = 4, wrong: int = 3, window=None, **cfg):
    """A MuToR model whose registers draft the plain greedy continuation, except every ``wrong``-th position
    (0: a token the model never picks): drafts both kept and rejected."""
    base = make_model(family, window=window)
    ids = _prompt(seed)
    target = _plain(base, ids, new, eos_token_id=None)[0].tolist()
    model = MuToRModel(base, MuToRConfig(d_max=4, **cfg))
    plant(model, lambda p, k: 0 if p >= len(target) or p % wrong == 0 else target[p])
    return base, ids, model


@pytest.mark.parametrize("family,window", [("llama", None), ("qwen2", 3), ("gemma3", 3), ("mistral", 3),
                                           ("gpt2", None)])
@pytest.mark.parametrize("k", [4, "auto"])
def test_custom_generate_is_lossless(family, window, k):
    base = make_model(family, window=window)
    model = MuToRModel(base, MuToRConfig(d_max=4))
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)     # untrained: drafts mostly rejected
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=k)
    for seed in (1, 2):
        ids = _prompt(seed)
        got = _plain(base, ids, 20, eos_token_id=None, custom_generate=drafter)
        assert torch.equal(got, _plain(base, ids, 20, eos_token_id=None)), (family, window, k, seed)
        assert drafter.last_stats.new_tokens == 20


@pytest.mark.parametrize("family,window", [("llama", None), ("gemma3", 3), ("mistral", 3)])
def test_custom_generate_with_drafts_kept_and_rejected(family, window):
    base, ids, model = _oracle(family, window=window)
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=4)
    got = _plain(base, ids, 20, eos_token_id=None, custom_generate=drafter)
    assert torch.equal(got, _plain(base, ids, 20, eos_token_id=None))
    stats = drafter.last_stats
    assert stats.forwards < 20 and 0 < sum(stats.accepted.values()) < sum(stats.offered.values())


def _bidirectional_run(tmp_path):
    """A bidirectional-prefix MuToR run as the user has it: saved, then loaded back as a vanilla model."""
    model = MuToRModel(make_model("llama"), MuToRConfig(d_max=3, prefix_attention="bidirectional"))
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)
    model.save_pretrained(tmp_path)
    return AutoModelForCausalLM.from_pretrained(tmp_path).eval()


def test_a_bidirectional_prefix_run_drafts_with_the_prompt_attention_its_sidecar_records(tmp_path):
    """``from_pretrained(run)`` decodes as ``mutor eval`` does (the prompt attending to itself both ways), where
    plain ``generate`` attends causally and gives other tokens."""
    from mutor.eval.generation import greedy_generate

    vanilla, ids = _bidirectional_run(tmp_path), _prompt(1)
    drafter = RegisterDrafter.from_pretrained(tmp_path, draft_registers=3)
    assert drafter.prefix_attention == "bidirectional"
    got = _plain(vanilla, ids, 15, eos_token_id=None, custom_generate=drafter)[0, ids.shape[1]:].tolist()
    ref = greedy_generate(vanilla, ids.tolist(), 15, pad_id=0, eos_id=None, prefix_attention="bidirectional")[0]
    assert got == ref
    assert got != _plain(vanilla, ids, 15, eos_token_id=None)[0, ids.shape[1]:].tolist()   # the trap it avoids
    plainly = RegisterDrafter.from_pretrained(tmp_path, draft_registers=1)                # no drafts, same prompt
    assert _plain(vanilla, ids, 15, eos_token_id=None, custom_generate=plainly)[0, ids.shape[1]:].tolist() == ref
    assert plainly.last_stats.offered == {} and plainly.last_stats.forwards == 15
    own = MuToRModel.from_pretrained(tmp_path)
    assert RegisterDrafter.from_pretrained(own).prefix_attention == "bidirectional"
    again, _ = generate(tmp_path, ids, 15, draft_registers=3, eos_token_id=[])     # mutor.generate: the same
    assert again[0, ids.shape[1]:].tolist() == ref


def test_an_explicit_prefix_attention_wins_and_warns_where_it_differs_from_the_runs(tmp_path):
    vanilla, ids = _bidirectional_run(tmp_path), _prompt(1)
    with pytest.warns(UserWarning, match="trained with prefix_attention='bidirectional'; decoding with "
                                         "prefix_attention='causal'"):
        causal = RegisterDrafter.from_pretrained(tmp_path, draft_registers=3, prefix_attention="causal")
    assert causal.prefix_attention == "causal"
    assert torch.equal(_plain(vanilla, ids, 15, eos_token_id=None, custom_generate=causal),
                       _plain(vanilla, ids, 15, eos_token_id=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                   # the run's own value: no warning
        RegisterDrafter.from_pretrained(tmp_path, prefix_attention="bidirectional")
        RegisterDrafter.from_pretrained(MuToRModel(make_model("llama"), MuToRConfig()), prefix_attention="causal")


def test_a_fixed_k_offers_a_draft_wherever_feeding_one_can_save_a_forward():
    """K=2 with registers that are always right, on short answers: a greedy draft stops before its eos and at
    max_new_tokens, so an answer of one token and its eos is offered none (its two forwards are plain decoding's
    two), one of two tokens and its eos is offered one and takes two forwards for its three tokens."""
    base, ids, model = _oracle(wrong=10 ** 6)
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=2)
    plain = _plain(base, ids, 6, eos_token_id=None)[0, ids.shape[1]:].tolist()
    assert len(set(plain[:3])) == 3                                   # each can be an eos without an earlier one

    def run(eos, n):
        out = _plain(base, ids, n, eos_token_id=eos, custom_generate=drafter)
        assert torch.equal(out, _plain(base, ids, n, eos_token_id=eos))
        return drafter.last_stats

    one = run(plain[1], 20)                                           # one token, then its eos
    assert (one.new_tokens, one.forwards, one.offered) == (2, 2, {})
    two = run(plain[2], 20)                                           # two tokens, then the eos
    assert (two.new_tokens, two.forwards, two.offered, two.accepted) == (3, 2, {2: 1}, {2: 1})
    room = run(None, 2)                                               # max_new_tokens 2: room for no draft
    assert (room.new_tokens, room.forwards, room.offered) == (2, 2, {})
    longer = run(None, 6)                                             # 1 + 2 + 2 tokens, then the last alone
    assert longer.forwards == 4 and longer.offered == {2: 2} == longer.accepted


def test_from_a_checkpoint_directory_on_a_vanilla_model(tmp_path):
    base, ids, model = _oracle()
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)
    model.save_pretrained(tmp_path)
    drafter = RegisterDrafter.from_pretrained(tmp_path)
    vanilla = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    got = vanilla.generate(ids, max_new_tokens=12, custom_generate=drafter, eos_token_id=None, pad_token_id=0)
    assert torch.equal(got, _plain(vanilla, ids, 12, eos_token_id=None))
    assert torch.equal(drafter.weights, model.register_embeddings.weight.detach())


def test_logits_processors_and_eos_are_applied_as_generate_applies_them():
    base, ids, model = _oracle(seed=5)                                          # a prompt whose decoding does not loop
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=4)
    kw = dict(repetition_penalty=1.5, no_repeat_ngram_size=2)                 # they depend on the tokens before
    ref = _plain(base, ids, 20, eos_token_id=None, **kw)
    assert torch.equal(_plain(base, ids, 20, eos_token_id=None, custom_generate=drafter, **kw), ref)
    plain = _plain(base, ids, 20, eos_token_id=None)[0, ids.shape[1]:].tolist()
    eos = next(t for t in plain[6:] if t not in plain[:6])                     # a token first generated later
    ref = _plain(base, ids, 20, eos_token_id=eos)
    assert ref.shape[1] < ids.shape[1] + 20 and ref[0, -1].item() == eos
    assert torch.equal(_plain(base, ids, 20, eos_token_id=eos, custom_generate=drafter), ref)


class _StopAfter(StoppingCriteria):
    """Stops once ``token`` has been generated (after the prompt)."""

    def __init__(self, token: int, prompt_len: int):
        self.token, self.prompt_len = token, prompt_len

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, self.prompt_len:] == self.token).any(-1)


class _Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def test_stopping_criteria_and_a_streamer_see_what_they_see_in_generate():
    base, ids, model = _oracle()
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=4)
    free = _plain(base, ids, 20, eos_token_id=None)[0, ids.shape[1]:].tolist()
    stop = StoppingCriteriaList([_StopAfter(free[9], ids.shape[1])])
    mine, theirs = _Recorder(), _Recorder()
    got = _plain(base, ids, 20, eos_token_id=None, stopping_criteria=stop, custom_generate=drafter, streamer=mine)
    ref = _plain(base, ids, 20, eos_token_id=None, stopping_criteria=stop, streamer=theirs)
    assert torch.equal(got, ref) and got.shape[1] <= ids.shape[1] + 10
    assert mine.puts == theirs.puts and mine.ended and theirs.ended


def test_return_dict_in_generate_gives_sequences_and_scores():
    base, ids, model = _oracle()
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=4)
    kw = dict(eos_token_id=None, return_dict_in_generate=True, output_scores=True)
    got, ref = _plain(base, ids, 12, custom_generate=drafter, **kw), _plain(base, ids, 12, **kw)
    assert torch.equal(got.sequences, ref.sequences) and len(got.scores) == len(ref.scores) == 12
    for a, b in zip(got.scores, ref.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _chi2_upper(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at the standard normal quantile ``z`` (0.999)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _two_tokens(base, ids, temperature: float, top_k: int) -> torch.Tensor:
    """(V, V) exact probability of the first two sampled tokens with temperature then top-k, as generate warps."""
    def warp(logits):                                                           # (n, V)
        scores = logits.double() / temperature
        kth = scores.topk(top_k, -1).values[:, -1:]
        return torch.softmax(scores.masked_fill(scores < kth, float("-inf")), -1)
    with torch.no_grad():
        p1 = warp(base(ids).logits[:, -1])[0]                                   # (V,)
        both = torch.cat([ids.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], 1)
        p2 = warp(base(both).logits[:, -1])                                     # (V, V)
    return p1[:, None] * p2


def _chi2(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, int]:
    expected = n * probs.flatten()
    big = expected >= 5
    obs, exp = counts.flatten()[big].double(), expected[big]
    rest_obs, rest_exp = counts.flatten()[~big].sum().double(), expected[~big].sum()
    stat = float(((obs - exp) ** 2 / exp).sum() + ((rest_obs - rest_exp) ** 2 / rest_exp if rest_exp > 0 else 0))
    return stat, int(big.sum()) + (1 if rest_exp > 0 else 0) - 1


def test_sampling_with_temperature_and_top_k_follows_the_models_distribution():
    """Speculative sampling inside generate: the first two tokens follow the exact two-token distribution after
    generate's own warpers (temperature, top-k), chi-square at the 0.999 level, with drafts both kept and
    rejected; the same draws are refused against the distribution at another temperature."""
    base = make_model("llama")
    with torch.no_grad():                                       # peaked distributions: temperature matters
        base.get_output_embeddings().weight.mul_(4)
    model = MuToRModel(base, MuToRConfig(d_max=3))
    ids = _prompt(7, n=5)
    T, top_k, n = 0.7, 8, 800
    exact = _two_tokens(base, ids, T, top_k)
    q = exact.sum(0).float()                                    # the second token's marginal: a close proposal
    plant(model, lambda p, k: q.clamp(min=1e-30).log())
    drafter = RegisterDrafter.from_pretrained(model, draft_registers=3)
    counts, offered, accepted = torch.zeros(VOCAB, VOCAB, dtype=torch.long), 0, 0
    torch.manual_seed(0)
    for _ in range(n):
        out = base.generate(ids, max_new_tokens=3, do_sample=True, temperature=T, top_k=top_k, top_p=1.0,
                            eos_token_id=None, pad_token_id=0, custom_generate=drafter)
        a, b = out[0, ids.shape[1]:ids.shape[1] + 2].tolist()                 # the first two of three
        counts[a, b] += 1
        offered += drafter.last_stats.offered.get(2, 0)
        accepted += drafter.last_stats.accepted.get(2, 0)
    assert 0.05 < accepted / offered < 0.95
    stat, df = _chi2(counts, exact, n)
    assert df >= 10 and stat < _chi2_upper(df), (stat, df)
    stat, df = _chi2(counts, _two_tokens(base, ids, 1.5, top_k), n)
    assert stat > _chi2_upper(df), (stat, df)


def test_a_directory_without_a_sidecar_is_refused_by_name(tmp_path):
    make_model("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no mutor_config.json: not a MuToR checkpoint"):
        RegisterDrafter.from_pretrained(tmp_path)
    with pytest.raises(TypeError, match="MuToR checkpoint directory or a MuToRModel"):
        RegisterDrafter.from_pretrained(make_model("llama"))


def test_a_2d_trained_model_is_refused(tmp_path):
    model = MuToRModel(make_model("llama"), MuToRConfig(d_max_2d=2, grid_width=4))
    with pytest.raises(ValueError, match="trained with 2D offsets"):
        RegisterDrafter.from_pretrained(model)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="trained with 2D offsets"):
        RegisterDrafter.from_pretrained(tmp_path)


def test_registers_of_another_model_are_refused(tmp_path):
    MuToRModel(make_model("llama"), MuToRConfig(d_max=3)).save_pretrained(tmp_path)
    drafter = RegisterDrafter.from_pretrained(tmp_path)
    for other in (make_model("qwen2"), make_model("gpt2")):
        with pytest.raises(ValueError, match="do not belong to this model"):
            _plain(other, _prompt(), 3, custom_generate=drafter)


def test_what_the_drafter_does_not_do_is_refused_in_one_line():
    base, ids, model = _oracle()
    drafter = RegisterDrafter.from_pretrained(model)
    refused = [
        (dict(input_ids=ids.repeat(2, 1)), "batch size 1"),
        (dict(input_ids=ids, attention_mask=torch.tensor([[0] + [1] * (ids.shape[1] - 1)])), "padding"),
        (dict(input_ids=ids, num_beams=2), "num_beams"),
        (dict(input_ids=ids, return_dict_in_generate=True, output_hidden_states=True), "hidden_states"),
    ]
    for kw, why in refused:
        with pytest.raises(ValueError, match=why) as err:
            base.generate(max_new_tokens=3, pad_token_id=0, custom_generate=drafter, **kw)
        assert "\n" not in str(err.value)
