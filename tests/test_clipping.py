"""Gradient clipping under MuToRTrainer (mutor.integrations.clipping): by default the model's update is clipped by the
model's own gradient norm, as it would be without mutor, and the wrapper's own parameters (register vector,
Multi-Token heads) by theirs; ``grad_clip="joint"`` is Trainer's clipping of everything together.

The references are written from that rule, not from the trainer: a plain forward/backward of the same batch
gives the gradients, and ``g * min(1, max_norm / (|g| + 1e-6))`` (torch's clip_grad_norm_ formula) the
clipped update of one SGD step with learning rate 1.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mutor import MuToRConfig, MuToRModel
from mutor.data.collator import PaddingCollator
from mutor.integrations.clipping import check_grad_clip
from mutor.integrations.trainer import MuToRTrainer, MuToRTrainingArguments
from mutor.methods.multi_token import MultiTokenConfig, MultiTokenModel
from mutor.models.presets import tiny_causal_lm

MAX_NORM = 0.05          # far below every group's norm here: both groups are clipped


def _rows(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, a = 3 + i % 3, 6 + i % 4
        ids = torch.randint(3, 259, (p + a,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * p + ids[p:]})
    return out


def _wrapper(kind: str, lora: bool):
    base = tiny_causal_lm(259, seed=0)
    if lora:
        from peft import LoraConfig, get_peft_model

        base = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    if kind == "mutor":      # one offset (d = 2): the trainer's batch and the reference place the same registers
        return MuToRModel(base, MuToRConfig(d_max=2, min_offset=2, loss_weight=0.3))
    return MultiTokenModel(base, MultiTokenConfig(d_max=2, loss_weight=0.3))


def _args(tmp, **kw):
    args = dict(output_dir=str(tmp), max_steps=1, per_device_train_batch_size=4, learning_rate=1.0, optim="sgd",
                report_to=[], save_strategy="no", logging_steps=1, seed=0, use_cpu=True, dataloader_pin_memory=False,
                disable_tqdm=True, remove_unused_columns=False, lr_scheduler_type="constant", weight_decay=0.0)
    return MuToRTrainingArguments(**{**args, **kw})


def _clipped(grads: list[torch.Tensor], max_norm: float) -> tuple[list[torch.Tensor], float]:
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    return [g * min(1.0, max_norm / (norm + 1e-6)) for g in grads], norm


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("kind", ["mutor", "multi_token"])
@pytest.mark.parametrize("mode", ["separate", "joint"])
def test_one_clipped_step_updates_each_group_by_its_own_clipped_gradient(tmp_path, kind, lora, mode):
    data = _rows()
    model = _wrapper(kind, lora)
    ref = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    # the reference: the whole batch (the trainer's one step), forward and backward, nothing clipped yet
    ref(**PaddingCollator()(data)).loss.backward()
    model_grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad and n.startswith("base_model.")}
    own_grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad and not n.startswith("base_model.")}
    assert own_grads and all(g is not None for g in own_grads.values())
    if mode == "separate":
        m_clip, m_norm = _clipped(list(model_grads.values()), MAX_NORM)
        o_clip, o_norm = _clipped(list(own_grads.values()), MAX_NORM)
        expected_grad_norm = m_norm
    else:
        both, expected_grad_norm = _clipped(list(model_grads.values()) + list(own_grads.values()), MAX_NORM)
        m_clip, o_clip = both[:len(model_grads)], both[len(model_grads):]
        o_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in own_grads.values()))
    expected = {n: before[n] - g for n, g in zip(list(model_grads) + list(own_grads), m_clip + o_clip)}

    trainer = MuToRTrainer(model=model, args=_args(tmp_path, max_grad_norm=MAX_NORM, grad_clip=mode),
                           train_dataset=data, data_collator=PaddingCollator())
    trainer.train()
    after = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    for n in expected:
        torch.testing.assert_close(after[n], expected[n], atol=2e-6, rtol=1e-5, msg=lambda m: f"{n}: {m}")
    log = next(h for h in trainer.state.log_history if "loss" in h)
    # grad_norm: the model's own norm (separate) or the joint one (joint); reg_grad_norm: the wrapper's own
    assert log["grad_norm"] == pytest.approx(expected_grad_norm, rel=1e-4)
    assert log["reg_grad_norm"] == pytest.approx(o_norm, rel=1e-4)
    assert log["grad_clipped"] == 1.0
    assert ("reg_grad_clipped" in log) == (mode == "separate")


def test_separate_clipping_leaves_the_model_update_as_without_the_wrapper(tmp_path):
    """At a=0 MuToR's objective is the next-token loss: under separate clipping the LoRA update equals a plain
    next-token run's exactly, clipping included (under joint clipping it would too, as the register then has
    no gradient; with a > 0 only separate clipping keeps the model's clip factor its own)."""
    from peft import LoraConfig, get_peft_model

    data = _rows()
    runs = []
    for wrap in (False, True):
        base = get_peft_model(tiny_causal_lm(259, seed=0),
                              LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
        model = MuToRModel(base, MuToRConfig(d_max=2, min_offset=2, loss_weight=0.0)) if wrap else base
        MuToRTrainer(model=model, args=_args(tmp_path / str(wrap), max_grad_norm=MAX_NORM), train_dataset=data,
                     data_collator=PaddingCollator()).train()
        runs.append({n: p.detach().clone() for n, p in base.named_parameters() if p.requires_grad})
    for n in runs[0]:
        torch.testing.assert_close(runs[1][n], runs[0][n], atol=1e-7, rtol=1e-6, msg=lambda m: f"{n}: {m}")


def test_separate_clipping_keeps_gradient_accumulation_equal_to_one_big_batch(tmp_path):
    """Clipping acts on the accumulated gradient: 1x4 and 2x2 still give the same update under it."""
    data = _rows()
    states = []
    for bs, ga in ((4, 1), (2, 2)):
        model = _wrapper("mutor", lora=True)
        torch.manual_seed(0)
        MuToRTrainer(model=model, args=_args(tmp_path / f"{bs}x{ga}", max_grad_norm=MAX_NORM,
                                             per_device_train_batch_size=bs, gradient_accumulation_steps=ga),
                     train_dataset=data, data_collator=PaddingCollator()).train()
        states.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    for n in states[0]:
        torch.testing.assert_close(states[1][n], states[0][n], atol=2e-6, rtol=1e-5, msg=lambda m: f"{n}: {m}")


def test_grad_clip_modes_and_backends_are_checked_by_name():
    with pytest.raises(ValueError, match=r"grad_clip must be one of \['separate', 'joint'\]"):
        check_grad_clip("per_layer")
    with pytest.raises(ValueError, match="DeepSpeed clips inside its engine.*grad_clip='joint'"):
        check_grad_clip("separate", deepspeed=True)
    with pytest.raises(ValueError, match="FSDP1"):
        check_grad_clip("separate", fsdp1=True)
    check_grad_clip("joint", deepspeed=True)
    with pytest.raises(ValueError, match="grad_clip must be one of"):
        MuToRTrainer(model=_wrapper("mutor", lora=False), args=_args("unused", grad_clip="sometimes"))
