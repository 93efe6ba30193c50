"""MuToRTrainer and `mutor train`: plain-Trainer equality, gradient accumulation, exact resume, vanilla checkpoints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from mutor import MuToRConfig, MuToRModel
from mutor.core.layout import build_layout
from mutor.data.collator import PaddingCollator
from mutor.integrations.trainer import MuToRTrainer
from mutor.methods.multi_token import MultiTokenConfig, MultiTokenModel
from mutor.methods.next_token import NextTokenModel
from mutor.models.presets import tiny_causal_lm
from mutor.run.recipe import load_recipe
from mutor.run.train import run_recipe
from mutor.testing import byte_tokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl"


def _examples(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, a = 3 + i % 4, 5 + (i * 3) % 7
        ids = torch.randint(3, 259, (p + a,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * p + ids[p:], "offset_index": i % 3})
    return out


class _WithOffsets(PaddingCollator):
    """Carries a fixed per-example offset choice, so runs with different batching sample the same offsets."""

    def __call__(self, features):
        batch = super().__call__(features)
        batch["offset_index"] = torch.tensor([f["offset_index"] for f in features])
        return batch


def _args(tmp, **kw):
    base = dict(output_dir=str(tmp), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2,
                report_to=[], save_strategy="no", logging_steps=1, seed=0, use_cpu=True,
                dataloader_pin_memory=False, disable_tqdm=True, remove_unused_columns=False, max_grad_norm=0.0)
    base.update(kw)
    return TrainingArguments(**base)


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a, b, atol=0.0):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0 if atol == 0 else 1e-5, msg=lambda m: f"{k}: {m}")


def test_next_token_is_exactly_a_plain_trainer_run(tmp_path):
    data = [{k: v for k, v in ex.items() if k != "offset_index"} for ex in _examples()]
    runs = []
    for cls in (Trainer, MuToRTrainer):
        model = tiny_causal_lm(259, seed=0)
        cls(model=model, args=_args(tmp_path / cls.__name__), train_dataset=data,
            data_collator=PaddingCollator()).train()
        runs.append(_state(model))
    _assert_same(*runs)


@pytest.mark.parametrize("cfg", [MuToRConfig(d_max=3, loss_weight=0.3),
                                 MuToRConfig(d_max=3, loss_weight=0.5, num_registers=2, seed=1),
                                 MultiTokenConfig(d_max=3, loss_weight=0.3)],
                         ids=["all-registers", "two-registers", "multi-token"])
def test_gradient_accumulation_matches_one_big_batch(tmp_path, cfg, monkeypatch):
    """Token-weighted means over the accumulated batch: 1x4 and 2x2 give the same update.

    SGD, because Adam's g/sqrt(v) turns float rounding in near-zero gradients into full-size steps.
    With ``num_registers``, which registers a row keeps comes from random scores drawn per batch
    (``torch.rand((B, T), generator=...)``), so 1x4 and 2x2 would keep different ones: the scores
    are made the positions, every row keeps its first eligible registers whatever the batching,
    and the two updates must be equal too (the register counts and denominators are then exercised
    with the cap binding)."""
    data = _examples()
    states = []
    capped = getattr(cfg, "num_registers", None) is not None
    drawn = []
    if capped:
        real_rand = torch.rand

        def position_scores(*size, generator=None, **kwargs):
            if generator is None:
                return real_rand(*size, **kwargs)
            B, T = size[0] if len(size) == 1 else size
            drawn.append((B, T))
            return torch.arange(T, dtype=torch.float).div(T).expand(B, T).clone()         # (B, T) in [0, 1)

        monkeypatch.setattr(torch, "rand", position_scores)
        batch = _WithOffsets()(data[:4])
        full = build_layout(batch["labels"], dataclasses.replace(cfg, num_registers=None), batch["attention_mask"],
                            offset_index=batch["offset_index"])
        assert int(full.reg_valid.sum(1).max()) > cfg.num_registers      # the cap binds on this data
    for bs, ga in ((4, 1), (2, 2)):
        wrapper = MultiTokenModel if isinstance(cfg, MultiTokenConfig) else MuToRModel
        model = wrapper(tiny_causal_lm(259, seed=0), cfg)
        torch.manual_seed(0)
        MuToRTrainer(model=model, args=_args(tmp_path / f"{bs}x{ga}", per_device_train_batch_size=bs,
                                             gradient_accumulation_steps=ga, optim="sgd"),
                     train_dataset=data, data_collator=_WithOffsets()).train()
        states.append(_state(model))
    assert not capped or drawn, "the register scores were not drawn through torch.rand: update this test"
    _assert_same(*states, atol=2e-6)


def test_fractional_eval_steps_are_a_share_of_max_steps(tmp_path):
    """eval_steps < 1 is a fraction of max_steps, resolved as Trainer does: ceil(5 * 0.3) = every 2 steps."""
    from mutor.integrations.callbacks import eval_interval

    assert eval_interval(0.3, 5) == 2 and eval_interval(0.001, 5) == 1 and eval_interval(3, 5) == 3
    assert eval_interval(None, 5) is None and eval_interval(0, 5) is None
    data = [{k: v for k, v in ex.items() if k != "offset_index"} for ex in _examples(8)]
    steps = []
    trainer = MuToRTrainer(model=tiny_causal_lm(259, seed=0), args=_args(tmp_path, max_steps=5, eval_steps=0.3),
                           train_dataset=data, data_collator=PaddingCollator(),
                           task_evaluator=lambda model, step: steps.append(step) or {"calls": float(len(steps))})
    trainer.train()
    assert trainer.state.eval_steps == 2                                   # Trainer's own resolution
    assert steps == [0, 2, 4, 5]
    assert [h["eval_step"] for h in trainer.state.log_history if "eval_step" in h] == [0, 2, 4, 5]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_task_evaluator_runs_in_trainings_precision_for_every_method(tmp_path, bf16):
    """The in-training task evaluation (star-graph curves) runs the plain model in training's precision, whether
    Trainer was given that model itself (plain next-token, whose forward accelerate autocasts) or a wrapper
    around it (whose forward, not the plain model's, accelerate autocasts): curves of both compare."""
    seen = {}
    for name in ("plain", "mutor"):
        base = tiny_causal_lm(259, seed=0)
        model = base if name == "plain" else MuToRModel(base, MuToRConfig(d_max=3))
        data = _examples(8) if name == "mutor" else [{k: v for k, v in ex.items() if k != "offset_index"}
                                                      for ex in _examples(8)]

        def evaluator(m, step, name=name):
            dtypes = seen.setdefault(name, set())
            hook = m.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, i, o: dtypes.add(o.dtype))
            m(input_ids=torch.tensor([[3, 4, 5]]))
            hook.remove()
            return {"calls": 1.0}

        MuToRTrainer(model=model, args=_args(tmp_path / name, max_steps=1, bf16=bf16), train_dataset=data,
                     data_collator=_WithOffsets() if name == "mutor" else PaddingCollator(),
                     task_evaluator=evaluator).train()
    want = {torch.bfloat16 if bf16 else torch.float32}
    assert seen == {"plain": want, "mutor": want}


def test_accumulated_denominators_are_the_global_counts(tmp_path):
    data = _examples(8)
    model = MuToRModel(tiny_causal_lm(259, seed=0), MuToRConfig(d_max=3, loss_weight=0.3))
    trainer = MuToRTrainer(model=model, args=_args(tmp_path, per_device_train_batch_size=2,
                                                   gradient_accumulation_steps=2, max_steps=1),
                           train_dataset=data, data_collator=_WithOffsets())
    batches = [_WithOffsets()(data[i:i + 2]) for i in (0, 2)]
    it = iter(batches)
    samples, n_items = trainer.get_batch_samples(it, 2, torch.device("cpu"))
    n_reg = trainer.count_registers(samples)          # what the step's first training_step does
    outs = [model(**b) for b in samples]
    assert int(n_items) == sum(o.num_ntp_tokens for o in outs)
    assert int(n_reg) == sum(o.num_registers for o in outs)


@pytest.mark.parametrize("cfg,builds_per_micro_batch", [(MuToRConfig(d_max=3, loss_weight=0.3), 1),
                                                        (MultiTokenConfig(d_max=3, loss_weight=0.3), 2)],
                         ids=["mutor", "multi-token"])
def test_each_micro_batch_builds_its_layout_once(tmp_path, cfg, builds_per_micro_batch, monkeypatch):
    """The layout the trainer counts for the denominator is the one the forward trains on: built once per
    micro-batch (Multi-Token: once per head), and the forward's output is the same as with a layout of its own."""
    import mutor.methods.multi_token.model as mt_module
    import mutor.methods.mutor.model as mutor_module
    from mutor.methods.base import COUNTED_LAYOUT

    module, name = (mt_module, "offset_target_layout") if isinstance(cfg, MultiTokenConfig) else (mutor_module,
                                                                                                 "build_layout")
    calls = []
    real_build = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real_build(*a, **k))
    wrapper = MultiTokenModel if isinstance(cfg, MultiTokenConfig) else MuToRModel
    model = wrapper(tiny_causal_lm(259, seed=0), cfg)
    MuToRTrainer(model=model, args=_args(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2),
                 train_dataset=_examples(), data_collator=_WithOffsets()).train()
    assert len(calls) == 2 * 2 * builds_per_micro_batch                   # 2 steps x 2 micro-batches
    batch = _WithOffsets()(_examples()[:4])
    counted = model.count_reg_targets(batch)
    assert COUNTED_LAYOUT in counted.forward_inputs and COUNTED_LAYOUT not in batch     # returned, batch unchanged
    with torch.no_grad():
        handed, own = model(**batch, **counted.forward_inputs), model(**batch)
    assert torch.equal(handed.loss, own.loss) and handed.num_registers == own.num_registers


RECIPE = {
    "method": "mutor", "seed": 0,
    "model": {"preset": "tiny-llama", "tokenizer": "byte"},
    "mutor": {"d_max": 3, "loss_weight": 0.3},
    "data": {"task": "gsm8k", "path": str(FIXTURE), "limit": 24},
    "training": {"max_steps": 6, "per_device_train_batch_size": 4, "learning_rate": 1e-3, "save_steps": 3,
                 "logging_steps": 3, "report_to": [], "use_cpu": True, "disable_tqdm": True,
                 "dataloader_pin_memory": False, "max_grad_norm": 0.05},     # clipping binds (model and registers)
}


@pytest.mark.parametrize("seed", [None, 3], ids=["global-rng", "private-generator"])
def test_evaluation_is_repeatable_and_leaves_the_training_rng_alone(tmp_path, seed):
    """The same weights give the same eval_loss at every evaluate() (offsets from a generator seeded each time),
    evaluating does not move the RNG that training draws its offsets from, and eval_ntp_loss / eval_reg_loss
    (token-weighted) are reported beside eval_loss."""
    data = [{k: v for k, v in ex.items() if k != "offset_index"} for ex in _examples()]
    model = MuToRModel(tiny_causal_lm(259, seed=0), MuToRConfig(d_max=4, loss_weight=0.3, seed=seed))
    trainer = MuToRTrainer(model=model, args=_args(tmp_path, per_device_eval_batch_size=4), train_dataset=data,
                           eval_dataset=data, data_collator=PaddingCollator())
    torch.manual_seed(123)
    before = (torch.random.get_rng_state(), model.rng_state())
    first, second = trainer.evaluate(), trainer.evaluate()
    assert torch.equal(torch.random.get_rng_state(), before[0])
    assert (before[1] is None and model.rng_state() is None) or torch.equal(model.rng_state(), before[1])
    for key in ("eval_loss", "eval_ntp_loss", "eval_reg_loss"):
        assert first[key] == second[key], key
    assert first["eval_loss"] == pytest.approx(0.7 * first["eval_ntp_loss"] + 0.3 * first["eval_reg_loss"], abs=1e-6)


def test_total_flos_counts_the_positions_each_method_runs(tmp_path):
    """total_flos is Trainer's 6 x positions x parameters over what each wrapper runs: next-token's equals a plain
    Trainer run's, MuToR adds its registers, Multi-Token its heads (Trainer alone would report 0 for a wrapper,
    which is not a PreTrainedModel)."""
    from mutor.methods.next_token import NextTokenConfig

    data = _examples()
    flos = {}
    for name in ("plain", "next_token", "mutor", "multi_token"):
        base = tiny_causal_lm(259, seed=0)
        model = {"plain": base, "next_token": NextTokenModel(base, NextTokenConfig()),
                 "mutor": MuToRModel(base, MuToRConfig(d_max=3)), "multi_token": MultiTokenModel(base)}[name]
        trainer = MuToRTrainer(model=model, args=_args(tmp_path / name), train_dataset=data,
                               data_collator=_WithOffsets())
        trainer.train()
        flos[name] = trainer.state.total_flos
    params = tiny_causal_lm(259, seed=0).num_parameters(exclude_embeddings=True)
    assert flos["plain"] > 0 and flos["next_token"] == flos["plain"]
    extra = flos["mutor"] - flos["plain"]
    assert extra > 0 and extra % (6 * params) == 0          # a whole number of register positions
    assert flos["multi_token"] > flos["plain"]


def test_summary_eval_history_holds_every_evaluation(tmp_path):
    out = tmp_path / "run"
    run_recipe(dict(RECIPE, data={**RECIPE["data"], "eval_path": str(FIXTURE), "eval_limit": 8},
                    training={**RECIPE["training"], "output_dir": str(out), "eval_strategy": "steps",
                              "eval_steps": 3, "save_strategy": "no"}), quiet=True)
    hist = json.loads((out / "summary.json").read_text())["eval_history"]
    assert [h["eval_step"] for h in hist] == [3, 6]
    assert all({"eval_loss", "eval_ntp_loss", "eval_reg_loss"} <= set(h) for h in hist)


def _final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return {**load_file(str(run_dir / "model.safetensors")), **load_file(str(run_dir / "mutor.safetensors"))}


@pytest.mark.parametrize("method,tied", [("mutor", False), ("next_token", False), ("multi_token", False),
                                         ("mutor", True)], ids=["mutor", "next_token", "multi_token", "mutor-tied"])
def test_resume_continues_exactly(tmp_path, method, tied):
    """6 steps straight == a run killed after checkpoint-3 and resumed in a new trainer (same offsets too); with
    tied input / output embeddings too (SmolLM2's: the checkpoint then lacks lm_head.weight)."""
    import shutil

    from safetensors.torch import load_file

    a, b = tmp_path / "a", tmp_path / "b"
    model = dict(RECIPE["model"], config_overrides={"tie_word_embeddings": True}) if tied else RECIPE["model"]
    recipe = dict(RECIPE, method=method, model=model)
    run_recipe(dict(recipe, training={**RECIPE["training"], "output_dir": str(a)}), quiet=True)
    b.mkdir()
    shutil.copytree(a / "checkpoint-3", b / "checkpoint-3")      # all an interrupted run would have left,
    shutil.copytree(a / "checkpoint-6", b / "checkpoint-6")      # and a checkpoint killed while being saved:
    (b / "checkpoint-6" / "trainer_state.json").unlink()          # Trainer writes trainer_state.json last
    out = run_recipe(dict(recipe, training={**RECIPE["training"], "output_dir": str(b)}), quiet=True, resume=True)
    assert out["runs"][0]["resumed_from"].endswith("checkpoint-3") and out["runs"][0]["global_step"] == 6
    _assert_same(load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors")))
    sidecar = {"mutor": "mutor.safetensors", "multi_token": "multi_token.safetensors"}.get(method)
    if sidecar:
        _assert_same(load_file(str(a / sidecar)), load_file(str(b / sidecar)))
    # and a finished run is skipped on --resume
    again = run_recipe(dict(recipe, training={**RECIPE["training"], "output_dir": str(b)}), quiet=True, resume=True)
    assert again["runs"][0]["resumed_from"].endswith("checkpoint-3")


def test_checkpoints_are_vanilla_models_plus_sidecar(tmp_path):
    r = dict(RECIPE, training={**RECIPE["training"], "output_dir": str(tmp_path), "max_steps": 3})
    run_recipe(r, quiet=True)
    ck = tmp_path / "checkpoint-3"
    for d in (ck, tmp_path):
        assert (d / "mutor.safetensors").is_file() and (d / "mutor_config.json").is_file()
        model = AutoModelForCausalLM.from_pretrained(str(d))
        assert type(model).__name__ == "LlamaForCausalLM"
    wrapped = MuToRModel.from_pretrained(str(tmp_path))
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(wrapped.base_model(input_ids=ids).logits, plain(input_ids=ids).logits)
    assert (tmp_path / "recipe.yaml").is_file() and (tmp_path / "tokenizer_config.json").is_file()


def test_lora_recipe_trains_adapter_and_registers(tmp_path):
    r = dict(RECIPE, lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"},
             training={**RECIPE["training"], "output_dir": str(tmp_path), "max_steps": 2, "save_steps": 2})
    out = run_recipe(r, quiet=True)
    params = out["runs"][0]["parameters"]
    assert params["lora"] > 0 and params["added_by_method"] == 64
    assert params["trainable"] == params["lora"] + params["added_by_method"]
    assert (tmp_path / "adapter_config.json").is_file() and not (tmp_path / "model.safetensors").exists()
    from peft import PeftModel

    base = PeftModel.from_pretrained(tiny_causal_lm(259, seed=1), str(tmp_path))   # a random base has no Hub id
    m = MuToRModel.from_pretrained(str(tmp_path), base=base)
    assert hasattr(m.base_model, "peft_config") and m.register_embeddings.weight.shape == (1, 64)


def test_bidirectional_next_token_places_no_registers(tmp_path):
    r = dict(RECIPE, method="next_token", prefix_attention="bidirectional",
             training={**RECIPE["training"], "output_dir": str(tmp_path), "max_steps": 2, "save_steps": 2,
                       "logging_steps": 1})
    out = run_recipe(r, quiet=True)
    assert out["runs"][0]["parameters"]["added_by_method"] == 0       # NextTokenModel adds nothing
    assert "reg_loss" not in out["runs"][0]["train_history"][-1] or \
        out["runs"][0]["train_history"][-1].get("reg_loss") is None


def test_chunked_loss_applies_to_the_next_token_baseline_too():
    """With loss_chunk_size, next_token trains through the same chunked loss as mutor (a fair baseline
    for speed and memory), and that loss is still the plain next-token loss."""

    from mutor.methods.registry import get_method

    recipe = load_recipe(dict(RECIPE, method="next_token", loss_chunk_size=5))
    base = tiny_causal_lm(259, seed=0)
    model = get_method("next_token").wrap(base, recipe.method_config("next_token"), recipe.loss_chunk_size)
    assert isinstance(model, NextTokenModel) and model.loss_chunk_size == 5
    assert model.num_added_parameters() == 0 and not hasattr(model, "register_embeddings")
    batch = PaddingCollator()([{k: v for k, v in ex.items() if k != "offset_index"} for ex in _examples(4)])
    out = model(**batch)
    assert out.num_registers == 0
    torch.testing.assert_close(out.loss, base(**batch, use_cache=False).loss, atol=1e-6, rtol=1e-6)
    plain_recipe = load_recipe(dict(RECIPE, method="next_token"))
    plain = get_method("next_token").wrap(base, plain_recipe.method_config("next_token"), plain_recipe.loss_chunk_size)
    assert plain is base


def test_next_token_baseline_is_honest(tmp_path):
    """The bidirectional-prefix baseline: no parameter added, no register, no offset drawn from the global RNG,
    and a checkpoint that is the vanilla model plus one config file recording the prefix attention."""
    from mutor.eval.harness import run_info
    from mutor.methods.registry import get_method

    recipe = load_recipe(dict(RECIPE, method="next_token", prefix_attention="bidirectional"))
    model = get_method("next_token").wrap(tiny_causal_lm(259, seed=0), recipe.method_config("next_token"))
    assert isinstance(model, NextTokenModel) and model.num_added_parameters() == 0
    batch = PaddingCollator()([{k: v for k, v in ex.items() if k != "offset_index"} for ex in _examples(4)])
    before = torch.random.get_rng_state()
    assert model.count_reg_targets(dict(batch)).count == 0
    out = model(**batch)
    assert torch.equal(before, torch.random.get_rng_state())
    assert out.num_registers == 0 and out.reg_count_per_offset.numel() == 0
    torch.testing.assert_close(out.loss, out.ntp_loss)
    model.save_pretrained(tmp_path / "m")
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert "next_token_config.json" in files and not any(f.startswith("mutor") for f in files)
    assert run_info(str(tmp_path / "m"))["prefix_attention"] == "bidirectional"
    again = NextTokenModel.from_pretrained(tmp_path / "m")
    torch.testing.assert_close(again(**batch).loss, out.loss)


def test_packed_text_pretraining(tmp_path, monkeypatch):
    """Plain text trains packed: a training batch is one row of whole documents whose position ids
    restart at 0, no register targets a token of another document, and the packed loss equals the
    documents' losses computed one document at a time (same weights, same offset)."""
    checked = []
    real_forward = MuToRModel.forward

    def spy(self, input_ids, attention_mask=None, labels=None, position_ids=None, offset_index=None, **kw):
        if self.training and not checked:
            checked.append(_check_packed_batch(real_forward, self, input_ids, attention_mask, labels, position_ids,
                                               offset_index))
        return real_forward(self, input_ids, attention_mask=attention_mask, labels=labels, position_ids=position_ids,
                            offset_index=offset_index, **kw)

    monkeypatch.setattr(MuToRModel, "forward", spy)
    r = dict(RECIPE, data={"task": "text", "path": str(FIXTURE.parent / "text_tiny.jsonl"), "max_length": 64},
             training={**RECIPE["training"], "output_dir": str(tmp_path), "max_steps": 2, "save_steps": 2,
                       "logging_steps": 1})
    out = run_recipe(r, quiet=True)
    assert checked == [4]                                   # per_device_train_batch_size documents in one row
    hist = out["runs"][0]["train_history"]
    assert len(hist) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in hist)


@torch.no_grad()
def _check_packed_batch(forward, model, ids, attention_mask, labels, pos, offset_index) -> int:
    """Checks one packed training batch against its documents run one at a time; returns the document count."""
    assert attention_mask is None and ids.shape[0] == 1 and pos is not None and offset_index is not None
    starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
    docs = list(zip(starts[:-1], starts[1:]))
    assert len(docs) > 1 and starts[0] == 0
    for a, b in docs:                                       # positions count 0, 1, ... inside each document
        assert pos[0, a:b].tolist() == list(range(b - a)) and labels[0, a] == -100
    packed = forward(model, ids, labels=labels, position_ids=pos, offset_index=offset_index, return_logits=True)
    lay = packed.layout
    d = model.mutor_config.raster_offset(model.mutor_config.offset_choices()[int(offset_index[0])])
    src = lay.reg_source[0][lay.reg_valid[0]]                                       # (n_reg,) source indices
    doc_of = torch.bucketize(torch.arange(ids.shape[1]), torch.tensor(starts[1:]), right=True)   # (T,)
    assert lay.num_registers > 0 and bool((src + d < ids.shape[1]).all())
    assert torch.equal(doc_of[src], doc_of[src + d])        # no register targets another document
    assert torch.equal(lay.reg_labels[0][lay.reg_valid[0]], ids[0, src + d])
    ntp = reg = 0.0
    n_ntp = n_reg = 0
    for a, b in docs:
        doc_labels = labels[:, a:b].clone()
        one = forward(model, ids[:, a:b], labels=doc_labels, offset_index=offset_index)
        ntp, n_ntp = ntp + float(one.ntp_loss) * one.num_ntp_tokens, n_ntp + one.num_ntp_tokens
        reg, n_reg = reg + float(one.reg_loss) * one.num_registers, n_reg + one.num_registers
    assert (packed.num_ntp_tokens, packed.num_registers) == (n_ntp, n_reg)
    assert float(packed.ntp_loss) == pytest.approx(ntp / n_ntp, rel=1e-5)
    assert float(packed.reg_loss) == pytest.approx(reg / n_reg, rel=1e-5)
    return len(docs)


@pytest.mark.parametrize("bad, message", [
    ({"methd": "mutor"}, "unknown key"),
    ({"method": "mtp"}, "is not one of"),
    ({"method": ["mutor", "mutor"]}, "repeats"),
    ({"mutor": {"d_max": 0}}, "MuToRConfig.d_max"),
    ({"model": {"presett": "x"}}, "unknown key"),
    ({"data": {"path": "x"}}, "needs a `task`"),
    ({"prefix_attention": "both"}, "causal or bidirectional"),
    ({"grad_clip": "together"}, r"grad_clip must be one of \['separate', 'joint'\]"),
    ({"method": "mutr"}, "did you mean 'mutor'"),
    ({"mutor": {"dmax": 3}}, "did you mean 'd_max'"),
    ({"multi_token": {"d_mx": 2}}, "did you mean 'd_max'"),
    ({"model": {"preset": None}}, "set name_or_path .* or preset"),
    ({"model": {"dtype": "float8"}}, "model.dtype must be float32, bfloat16 or float16"),
])
def test_recipe_errors_name_the_problem(bad, message):
    with pytest.raises(ValueError, match=message):
        load_recipe({**RECIPE, **bad})


def test_a_preset_recipe_switches_to_a_real_model_by_override(tmp_path):
    """model.preset=null with model.name_or_path: the preset recipe trains the given model."""
    model_dir = tmp_path / "model"
    tiny_causal_lm(259, seed=1).save_pretrained(model_dir)
    r = load_recipe(RECIPE, ["model.preset=null", f"model.name_or_path={model_dir}"])
    assert r.model.preset is None and r.model.name_or_path == str(model_dir)


def test_shipped_launch_configs_are_listed_apart_from_recipes():
    from mutor.run.recipe import find_recipe

    with pytest.raises(FileNotFoundError, match="is an accelerate launch config, not a recipe"):
        find_recipe("accelerate/ddp-8gpu")
    with pytest.raises(FileNotFoundError) as err:
        find_recipe("no-such-recipe")
    recipes, launch = str(err.value).split("accelerate launch configs")
    assert "tiny/gsm8k" in recipes and "accelerate/" not in recipes and "accelerate/ddp-8gpu" in launch


def test_unknown_training_field_and_task_option(tmp_path):
    with pytest.raises(ValueError, match="TrainingArguments"):
        run_recipe(dict(RECIPE, training={**RECIPE["training"], "output_dir": str(tmp_path), "lr": 1}), quiet=True)
    with pytest.raises(ValueError, match="colour"):
        run_recipe(dict(RECIPE, data={**RECIPE["data"], "colour": "red"},
                        training={**RECIPE["training"], "output_dir": str(tmp_path)}), quiet=True)


def test_overrides_are_yaml_and_dotted():
    r = load_recipe(RECIPE, ["training.learning_rate=2e-5", "method=[next_token,mutor]", "mutor.d_max=6",
                             "lora=null"])
    assert r.training["learning_rate"] == 2e-5 and r.methods == ["next_token", "mutor"]
    assert r.method_config("mutor").d_max == 6 and r.lora is None
    with pytest.raises(ValueError, match="key.sub=value"):
        load_recipe(RECIPE, ["training.learning_rate"])


def test_template_loss_only_on_completion_and_length_filter():
    from mutor.data import build_training_data

    tok = byte_tokenizer()
    task = build_training_data("gsm8k", {"path": str(FIXTURE), "max_length": 120}, tok)
    assert task.info["dropped_too_long"] > 0
    assert task.info["num_examples"] + task.info["dropped_too_long"] == task.info["loaded"] == 64
    ex = task.train_dataset[0]
    assert len(ex["input_ids"]) <= 120
    n_prompt = sum(1 for x in ex["labels"] if x == -100)
    prompt = tok.decode(ex["input_ids"][:n_prompt])
    assert prompt.startswith("Question: ") and prompt.endswith("\n\nAnswer:")
    completion = tok.decode(ex["labels"][n_prompt:])
    assert completion.startswith(" ") and "####" in completion and ex["labels"][-1] == tok.eos_token_id


def test_cli_runs_a_shipped_recipe(tmp_path):
    from mutor.run.cli import main

    main(["train", "tiny/gsm8k", "method=[next_token,mutor,multi_token]", "training.max_steps=2",
          "training.save_steps=2", "training.report_to=[]", "training.disable_tqdm=true",
          "--output-dir", str(tmp_path), "--quiet"])
    cmp = json.loads((tmp_path / "comparison.json").read_text())
    assert [r["method"] for r in cmp["runs"]] == ["next_token", "mutor", "multi_token"]
    assert (tmp_path / "comparison.md").is_file() and (tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.parametrize("method", ["next_token", "mutor", "multi_token"])
def test_each_method_lowers_its_loss_on_fixture_data(tmp_path, method):
    r = dict(RECIPE, method=method, training={**RECIPE["training"], "output_dir": str(tmp_path), "max_steps": 8,
                                              "logging_steps": 1, "save_steps": 8, "learning_rate": 3e-3})
    hist = run_recipe(r, quiet=True)["runs"][0]["train_history"]
    assert len(hist) == 8
    first, last = hist[0], hist[-1]
    assert last["loss"] < first["loss"]
    if method != "next_token":
        assert last["ntp_loss"] < first["ntp_loss"] and last["reg_loss"] < first["reg_loss"]


def test_missing_column_and_empty_data_fail_before_training(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl.*no field.*\['question'\]"):
        run_recipe(dict(RECIPE, data={"task": "gsm8k", "path": str(bad)},
                        training={**RECIPE["training"], "output_dir": str(tmp_path / "a")}), quiet=True)
    with pytest.raises(ValueError, match="longer than max_length=20"):
        run_recipe(dict(RECIPE, data={**RECIPE["data"], "max_length": 20},
                        training={**RECIPE["training"], "output_dir": str(tmp_path / "b")}), quiet=True)
    assert not (tmp_path / "a" / "checkpoint-3").exists()


def test_gradient_checkpointing_under_trainer_and_trl_names_raises_no_deprecation_warning(tmp_path):
    """Trainer asks for activation_checkpointing_enable, TRL and peft for gradient_checkpointing_* and
    is_gradient_checkpointing: the wrapper answers all of them, and LoRA wrapping, without transformers'
    v6 deprecation warnings, and checkpointing is really on during training."""
    import warnings

    from mutor.run.build import apply_lora

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model = MuToRModel(apply_lora(tiny_causal_lm(259, seed=0), {"r": 4, "target_modules": "all-linear"}),
                           MuToRConfig(d_max=3, seed=0))
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert model.is_gradient_checkpointing and model.is_activation_checkpointing
        model.gradient_checkpointing_disable()
        assert not model.is_gradient_checkpointing
        trainer = MuToRTrainer(model=model, args=_args(tmp_path, activation_checkpointing=True,
                                                       activation_checkpointing_kwargs={"use_reentrant": False}),
                               train_dataset=[{k: v for k, v in ex.items() if k != "offset_index"}
                                              for ex in _examples()], data_collator=PaddingCollator())
        trainer.train()
        assert model.is_activation_checkpointing


def test_recipes_gradient_checkpointing_key_reaches_trainer_by_its_current_name(tmp_path):
    import warnings

    from mutor.run.build import training_arguments

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        recipe = load_recipe("llama-3-8b/gsm8k")
        args = training_arguments(recipe.training, recipe.seed, tmp_path)
    assert args.gradient_checkpointing is True
