"""The register vector is parametrised as the official code's ``<reg>`` vocabulary row.

The official code adds a ``<reg>`` token to the tokenizer and resizes the embeddings, so on Gemma the register's
input is its table row times the model's embedding scale (sqrt(hidden)), and AdamW steps that row. The reference
here is that model, written from the official behaviour: a copy of the base with one extra vocabulary row, each
register a ``<reg>`` token after x_s..x_t at position t+d-1 (a register sees those tokens and itself), its logit
over the original vocabulary (the extra softmax class of the official code is a separate, documented difference),
and the register loss ``a`` times the mean cross-entropy over registers. MuToR's register vector must enter the
model as that row does, get its gradient, and move as it moves under the same AdamW step.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from families import VOCAB, make_family, make_model, padded_batch

from mutor import MuToRConfig, MuToRModel
from mutor.methods.mutor import SIDECAR_CONFIG

SCALED = {"gemma": lambda: make_family("gemma"), "gemma2": lambda: make_model("gemma2", "eager"),
          "gemma3": lambda: make_model("gemma3")}
A = 0.3


def _pair(family: str, scale_registers: bool = True):
    """A MuToR model and the official-style reference (one extra vocabulary row), holding the same row u."""
    base = (SCALED[family] if family in SCALED else lambda: make_model(family))().float()
    ref = copy.deepcopy(base)
    ref.resize_token_embeddings(VOCAB + 1, mean_resizing=False)
    cfg = MuToRConfig(d_max=3, loss_weight=A, register_embedding_scale=scale_registers, seed=0)
    model = MuToRModel(base, cfg)
    u = torch.randn(model.register_embeddings.weight.shape[1], generator=torch.Generator().manual_seed(1)) * 0.05
    with torch.no_grad():
        model.register_embeddings.weight[0] = u
        ref.get_input_embeddings().weight[VOCAB] = u
    return model, ref


def _official_loss(ref, batch: dict, layout, cfg: MuToRConfig) -> torch.Tensor:
    """a * mean over registers of the cross-entropy of a <reg> token after x_<=t at position t+d-1."""
    losses = []
    choices = cfg.offset_choices()
    for b, r in (layout.reg_labels != -100).nonzero().tolist():
        t, d = int(layout.reg_source[b, r]), choices[int(layout.offset_index[b])][0]
        ids = torch.cat([batch["input_ids"][b, :t + 1], torch.tensor([VOCAB])])[None]          # (1, t+2)
        pos = torch.cat([torch.arange(t + 1), torch.tensor([t + d - 1])])[None]               # (1, t+2)
        # an explicit all-ones mask: without one transformers reads a non-increasing position id as a new document
        logits = ref(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids),
                     use_cache=False).logits[0, -1, :VOCAB]                                    # (V,)
        losses.append(F.cross_entropy(logits[None].float(), batch["input_ids"][b, t + d][None]))
    return A * torch.stack(losses).mean()


@pytest.mark.parametrize("family", [*SCALED, "llama"])
def test_register_enters_the_model_as_the_official_reg_row(family):
    model, ref = _pair(family)
    official = ref.get_input_embeddings()(torch.tensor([VOCAB]))[0]                          # (C,)
    torch.testing.assert_close(model.register_inputs(torch.tensor([0]), torch.float32)[0], official, rtol=0, atol=0)
    if family in SCALED:
        assert not torch.allclose(official, model.register_embeddings.weight[0]), "the test needs a scaled model"


@pytest.mark.parametrize("family", list(SCALED))
def test_register_gradient_and_adamw_step_match_the_official_row(family):
    model, ref = _pair(family)
    model.train(), ref.train()
    batch = padded_batch(seed=3)
    offsets = torch.tensor([0, 1, 2])
    out = model(**batch, offset_index=offsets, return_logits=True)
    out.loss.backward()
    _official_loss(ref, batch, out.layout, model.mutor_config).backward()
    mine = model.register_embeddings.weight.grad[0]
    theirs = ref.get_input_embeddings().weight.grad[VOCAB]
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)

    # one AdamW step on each row alone: the register's input-space vector moves as the official row's does
    opt_m = torch.optim.AdamW([model.register_embeddings.weight], lr=1e-2, weight_decay=0.0)
    opt_r = torch.optim.AdamW([ref.get_input_embeddings().weight], lr=1e-2, weight_decay=0.0)
    ref.get_input_embeddings().weight.grad[:VOCAB] = 0
    before = model.register_inputs(torch.tensor([0]), torch.float32)[0].detach().clone()
    opt_m.step(), opt_r.step()
    moved = model.register_inputs(torch.tensor([0]), torch.float32)[0].detach() - before
    official = ref.get_input_embeddings()(torch.tensor([VOCAB]))[0].detach() - before
    torch.testing.assert_close(moved, official, rtol=1e-4, atol=1e-6)


def test_unscaled_option_moves_the_register_hidden_size_sqrt_times_less():
    """register_embedding_scale=False adds the vector after the scaling: the same step moves it sqrt(C) times less
    in input space than the official row moves (what the option is documented to do)."""
    scaled, _ = _pair("gemma3")
    plain, _ = _pair("gemma3", scale_registers=False)
    steps = []
    for model in (scaled, plain):
        model.train()
        model(**padded_batch(seed=3), offset_index=torch.tensor([0, 1, 2])).loss.backward()
        before = model.register_inputs(torch.tensor([0]), torch.float32)[0].detach().clone()
        torch.optim.AdamW([model.register_embeddings.weight], lr=1e-2, weight_decay=0.0).step()
        steps.append((model.register_inputs(torch.tensor([0]), torch.float32)[0].detach() - before).norm())
    ratio = float(steps[0] / steps[1])
    assert ratio == pytest.approx(64 ** 0.5, rel=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_initial_registers_have_the_spread_of_embedded_tokens(dtype):
    """The init draws in table space with the embedded tokens' std divided by the scale, so the vector entering
    the model has the spread it had before the scale was applied to it."""
    base = make_model("gemma3").to(dtype)
    model = MuToRModel(base, MuToRConfig(seed=0, register_embedding_scale=True))
    emb = base.get_input_embeddings()
    tokens = emb(torch.arange(VOCAB)[None]).float().std()
    reg = model.register_inputs(torch.tensor([0]), dtype).detach().float().std()
    assert 0.6 < float(reg / tokens) < 1.6


def test_sidecar_without_the_field_loads_as_the_unscaled_vector(tmp_path):
    """A checkpoint saved before the option existed added its vector after the scaling: it reads back that way."""
    model = MuToRModel(make_model("gemma3"), MuToRConfig(seed=0))
    model.save_pretrained(tmp_path / "new")
    assert MuToRModel.from_pretrained(tmp_path / "new").mutor_config.register_embedding_scale is True
    model.save_pretrained(tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / SIDECAR_CONFIG).read_text())
    del cfg["register_embedding_scale"]
    (tmp_path / "old" / SIDECAR_CONFIG).write_text(json.dumps(cfg))
    old = MuToRModel.from_pretrained(tmp_path / "old")
    assert old.mutor_config.register_embedding_scale is False
    torch.testing.assert_close(old.register_inputs(torch.tensor([0]), torch.float32),
                               old.register_embeddings.weight[:1], rtol=0, atol=0)


def test_register_embedding_scale_must_be_a_bool():
    with pytest.raises(ValueError, match="register_embedding_scale"):
        MuToRConfig(register_embedding_scale="yes")
