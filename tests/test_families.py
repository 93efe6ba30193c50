"""The family matrix: every further causal-LM family passes both invariants or is refused by name.

``tests/test_equivalence.py`` runs the full cross product (offsets x embeddings x batches,
sliding windows that bind, flex) on the core families in ``FAMILIES``. Here each row of
``MORE_FAMILIES`` (MoE, sinks, partial rotary, NoPE layers, learned positions, multipliers, ...)
gets the two invariants once, on a right-padded and on a packed batch, kept lean so that the
whole matrix stays within the fast suite:

1. regular tokens: MuToR's next-token logits and ``ntp_loss`` equal a plain forward (padded) or
   one plain forward per document (packed; several of these families - opt, falcon, gpt_oss
   under eager, ... - do not split packed documents themselves, so the reference does);
2. registers: each one equals a single-register reference forward of its own prefix
   (``register_refs``: built here, not with mutor's masks), offsets 1..4 all seen;
3. drafting: a round's logits through the float32 head product (``W @ h^T``, ``mutor.generation.forward``) equal
   those through the model's own head, and a model whose logits are scaled keeps its own head.

Each row of ``REFUSED_FAMILIES`` must be refused at construction, by MuToRModel and by the
Multi-Token baseline, with a ValueError naming the model class and the reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from families import MORE_FAMILIES, REFUSED_FAMILIES, make_family, make_refused, packed_batch, padded_batch
from references import TOL, drafting_round, kept_rows, plain_forward, register_refs, run_mutor

from mutor import MuToRConfig, MuToRModel
from mutor.generation.forward import head_product
from mutor.methods.multi_token import MultiTokenModel

# offsets per row (indices into offset_choices, d = index + 1): padded has 3 rows, packed 2; together d = 1..4
OFFSETS = {"padded": (padded_batch, [0, 1, 2]), "packed": (packed_batch, [3, 1])}


def per_document_forward(base, batch: dict) -> torch.Tensor:
    """(B, T, V) logits of one plain forward per packed document (documents restart at position 0)."""
    ids, pos = batch["input_ids"], batch["position_ids"]
    starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
    assert bool((pos == pos[0]).all())                                  # same documents in every row
    with torch.no_grad():
        return torch.cat([base(input_ids=ids[:, s:e], use_cache=False).logits
                          for s, e in zip(starts[:-1], starts[1:])], 1)  # (B, T, V)


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_regular_tokens_match_plain_model(family):
    base = make_family(family)
    model = MuToRModel(base, MuToRConfig(d_max=4, seed=1))
    for kind, (make_batch, offsets) in OFFSETS.items():
        batch = make_batch()
        out = run_mutor(model, batch, torch.tensor(offsets))
        if kind == "packed":
            ref_logits = per_document_forward(base, batch)
            labels = batch["labels"]
            ref_loss = F.cross_entropy(ref_logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        else:
            ref = plain_forward(base, batch)
            ref_logits, ref_loss = ref.logits, ref.loss
        torch.testing.assert_close(out.ntp_loss, ref_loss, **TOL, msg=lambda m: f"{family} {kind} ntp_loss: {m}")
        T = batch["input_ids"].shape[1]
        rows = [(i, b, l) for i, (b, l) in enumerate(kept_rows(out)) if l < T]
        assert len(rows) == out.num_ntp_tokens > 0
        for i, b, l in rows:
            torch.testing.assert_close(out.logits[i], ref_logits[b, l], **TOL,
                                       msg=lambda m: f"{family} {kind} token b={b} t={l}: {m}")


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_each_register_matches_independent_reference(family):
    model = MuToRModel(make_family(family), MuToRConfig(d_max=4, seed=2))
    seen = set()
    for kind, (make_batch, offsets) in OFFSETS.items():
        batch = make_batch()
        out = run_mutor(model, batch, torch.tensor(offsets))
        n = 0
        for got, ref, (b, t, d) in register_refs(model, batch, out):
            torch.testing.assert_close(got, ref, **TOL,
                                       msg=lambda m: f"{family} {kind} register b={b} t={t} d={d}: {m}")
            seen.add(d)
            n += 1
        assert n == out.num_registers > 0
    assert seen == {1, 2, 3, 4}


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_a_drafting_rounds_head_product_gives_the_models_own_logits(family):
    model = MuToRModel(make_family(family), MuToRConfig(d_max=4, seed=3))
    torch.nn.init.normal_(model.register_embeddings.weight, std=1.0)
    scaled = family in ("granite", "cohere", "cohere2")                   # logits_scaling, logit_scale
    assert (head_product(model) is None) == scaled
    prompt, draft = list(range(5, 12)), [13, 17, 19]
    mine, own = (drafting_round(model, head, prompt, draft) for head in ("product", "own"))     # (rows, V)
    torch.testing.assert_close(mine, own, **TOL, msg=lambda m: f"{family}: {m}")


@pytest.mark.parametrize("name", REFUSED_FAMILIES)
@pytest.mark.parametrize("wrapper", [MuToRModel, MultiTokenModel])
def test_refused_at_construction_naming_class_and_reason(name, wrapper):
    base = make_refused(name)
    reason = REFUSED_FAMILIES[name][1]
    with pytest.raises(ValueError) as err:
        wrapper(base)
    msg = str(err.value)
    owner = "MuToR" if wrapper is MuToRModel else "the Multi-Token baseline"
    assert f"{type(base).__name__} (model_type {base.config.model_type!r}) is not supported by {owner}" in msg
    assert reason in msg
