"""MuToRSFTTrainer: MuToR inside TRL's SFTTrainer, on TRL's dataset formats, with a tokenizer built in process.

References are independent of mutor's code: a plain ``trl.SFTTrainer`` run (weights, and its own
entropy / token-accuracy metrics), the labels TRL builds (registers are checked against them),
and MuToRTrainer's guarantees (gradient accumulation, exact resume) re-checked through TRL.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

trl = pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import datasets  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

from mutor import MuToRConfig, MuToRModel  # noqa: E402
from mutor.integrations.trl import MuToRSFTConfig, MuToRSFTTrainer  # noqa: E402
from mutor.methods.multi_token import MultiTokenConfig, MultiTokenModel  # noqa: E402
from mutor.models.presets import tiny_causal_lm  # noqa: E402

datasets.disable_progress_bars()

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<user>", "<assistant>"]
WORDS = [f"w{i}" for i in range(40)]
# assistant content and its end-of-turn token inside {% generation %}: what assistant_only_loss needs
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<assistant> {% generation %}{{ m['content'] }} </s>"
    "{% endgeneration %} {% else %}<user> {{ m['content'] }} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}")


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer (46 ids: 6 specials, w0..w39) with a chat template that marks assistant turns."""
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", additional_special_tokens=["<user>", "<assistant>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


TOK = word_tokenizer()
V = len(TOK)


def _w(*ks) -> str:
    return " ".join(f"w{k}" for k in ks)


def dataset(fmt: str, n: int = 24) -> Dataset:
    """Learnable toy data: every example counts upwards from a start word."""
    rows = []
    for i in range(n):
        a = i % 28
        if fmt in ("prompt_completion", "packing", "padding_free"):
            rows.append({"prompt": _w(a, a + 1, a + 2), "completion": " " + _w(*range(a + 3, a + 3 + 3 + i % 3))})
        elif fmt == "messages":
            rows.append({"messages": [{"role": "user", "content": _w(a, a + 1)},
                                      {"role": "assistant", "content": _w(a + 2, a + 3, a + 4)},
                                      {"role": "user", "content": _w(a + 5)},
                                      {"role": "assistant", "content": _w(a + 6, a + 7, a + 8, a + 9)}]})
        elif fmt == "text":
            rows.append({"text": _w(*range(a, a + 6 + i % 4))})
    return Dataset.from_list(rows)


FORMAT_ARGS = {
    "prompt_completion": {},
    "messages": {"assistant_only_loss": True},
    "text": {},
    "packing": {"packing": True, "max_length": 24},                  # bfd: padding-free rows, per-document positions
    "padding_free": {"padding_free": True, "max_length": None},
}


def _args(tmp, config=SFTConfig, **kw) -> SFTConfig:
    base = dict(output_dir=str(tmp), max_steps=4, per_device_train_batch_size=4, learning_rate=3e-3,
                report_to=[], use_cpu=True, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
                dataloader_pin_memory=False,
                bf16=False, gradient_checkpointing=False)     # SFTConfig's defaults (bf16 autocast even on CPU, and
                                                              # recomputed activations) only cost time on tiny models
    base.update(kw)
    return config(**base)


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=lambda m: f"{k}: {m}")


def _train_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


# --------------------------------------------------------------------------- plain SFTTrainer as the reference
def test_loss_weight_zero_is_a_plain_sfttrainer_run(tmp_path):
    """a=0: the same weights as trl.SFTTrainer after 3 steps, and the same loss and metrics on the way, with
    clipping binding at every step (mutor's default, separate clipping, leaves the model's own clipping as it is).

    SGD, because Adam's g/sqrt(v) turns float rounding in near-zero gradients into full-size steps."""
    runs = []
    for name in ("sft", "mutor"):
        base = tiny_causal_lm(V, seed=0)
        kw = dict(args=_args(tmp_path / name, max_steps=3, optim="sgd", learning_rate=0.1, gradient_checkpointing=True,
                             max_grad_norm=0.05),
                  train_dataset=dataset("prompt_completion"), processing_class=word_tokenizer())
        trainer = SFTTrainer(model=base, **kw) if name == "sft" else \
            MuToRSFTTrainer(model=base, mutor_config=MuToRConfig(d_max=3, loss_weight=0.0), **kw)
        trainer.train()
        runs.append((_state(base), _train_logs(trainer)))
    (sft_w, sft_log), (mutor_w, mutor_log) = runs
    _assert_same(sft_w, mutor_w, atol=1e-5)
    assert len(sft_log) == len(mutor_log) == 3
    for s, m in zip(sft_log, mutor_log):
        for key in ("loss", "entropy", "mean_token_accuracy", "num_tokens"):
            assert m[key] == pytest.approx(s[key], rel=1e-4, abs=1e-5), key
        assert m["ntp_loss"] == pytest.approx(s["loss"], rel=1e-4)
        assert s["grad_norm"] > 0.05 and m["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("mode", ["separate", "joint"])
def test_clipping_modes_reach_sfttrainer(tmp_path, mode):
    """grad_clip passes through MuToRSFTTrainer: the register's own gradient norm is logged beside grad_norm, and
    under separate clipping grad_norm is the model's own (below the joint norm when the register has a gradient)."""
    args = _args(tmp_path, MuToRSFTConfig, max_steps=1, max_grad_norm=0.05, grad_clip=mode)
    trainer = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), mutor_config=MuToRConfig(d_max=2, min_offset=2,
                                                                                         loss_weight=0.5), args=args,
                              train_dataset=dataset("prompt_completion"), processing_class=word_tokenizer())
    trainer.train()
    log = _train_logs(trainer)[0]
    assert log["reg_grad_norm"] > 0 and log["grad_clipped"] == 1.0
    assert ("reg_grad_clipped" in log) == (mode == "separate")
    model_params, own = trainer.model.parameter_groups()
    assert trainer.grad_clip == mode and len(own) == 1


def test_token_metrics_are_those_of_the_regular_tokens(tmp_path):
    """With registers (a=0.5), step 1's entropy and token accuracy are still what plain SFTTrainer logs on the same
    weights and batch: registers are invisible to regular tokens and left out of both metrics."""
    logs = []
    for name in ("sft", "mutor"):
        base = tiny_causal_lm(V, seed=0)
        kw = dict(args=_args(tmp_path / name, max_steps=1), train_dataset=dataset("messages"),
                  processing_class=word_tokenizer())
        kw["args"].assistant_only_loss = True
        trainer = SFTTrainer(model=base, **kw) if name == "sft" else \
            MuToRSFTTrainer(model=base, mutor_config=MuToRConfig(d_max=3, loss_weight=0.5), **kw)
        trainer.train()
        logs.append(_train_logs(trainer)[0])
    sft, mutor = logs
    assert mutor["reg_loss"] > 0
    for key in ("entropy", "mean_token_accuracy", "num_tokens"):
        assert mutor[key] == pytest.approx(sft[key], rel=1e-4, abs=1e-6), key
    assert mutor["ntp_loss"] == pytest.approx(sft["loss"], rel=1e-4)


# --------------------------------------------------------------------------- TRL's dataset formats
@pytest.mark.parametrize("fmt", list(FORMAT_ARGS))
def test_each_dataset_format_trains_and_lowers_both_losses(tmp_path, fmt):
    base = tiny_causal_lm(V, seed=0)
    args = _args(tmp_path, max_steps=4, logging_steps=2, bf16=fmt == "messages", **FORMAT_ARGS[fmt])  # and TRL's bf16
    trainer = MuToRSFTTrainer(model=base, args=args,
                              train_dataset=dataset(fmt), processing_class=TOK,
                              mutor_config=MuToRConfig(d_max=3, loss_weight=0.3))
    assert isinstance(trainer, SFTTrainer) and isinstance(trainer.model, MuToRModel)
    trainer.train()
    first, last = _train_logs(trainer)
    for key in ("ntp_loss", "reg_loss"):
        assert last[key] < first[key], (key, first[key], last[key])
    assert {"entropy", "mean_token_accuracy", "num_tokens", "reg_accuracy"} <= set(last)
    assert any(k.startswith("reg_loss/d=") for k in last)


@pytest.mark.parametrize("fmt", ["prompt_completion", "messages", "packing", "padding_free"])
def test_registers_sit_only_within_completion_or_assistant_turns(tmp_path, fmt):
    """Against the labels TRL built: every register after x_t has x_{t+1} and its target x_{t+d} supervised, in
    the same document; prompts / user turns (-100) are there, and hold no register source."""
    trainer = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), args=_args(tmp_path, **FORMAT_ARGS[fmt]),
                              train_dataset=dataset(fmt), processing_class=TOK,
                              mutor_config=MuToRConfig(d_max=3, loss_weight=0.3))
    batch = next(iter(trainer.get_train_dataloader()))
    labels = batch["labels"]
    pos = batch.get("position_ids")
    if fmt in ("packing", "padding_free"):
        assert labels.shape[0] == 1 and int((pos == 0).sum()) > 1            # several documents in one row
    checked = 0
    with torch.no_grad():
        out = trainer.model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=labels,
                            position_ids=pos, return_logits=True)
    lay = out.layout
    d_of = [c[0] for c in trainer.model.mutor_config.offset_choices()]
    for b, r in lay.reg_valid.nonzero().tolist():
        t, d = int(lay.reg_source[b, r]), d_of[int(lay.offset_index[b])]
        assert labels[b, t + 1] != -100 and labels[b, t + d] != -100, (fmt, b, t, d)
        assert int(lay.reg_labels[b, r]) == int(labels[b, t + d])
        if pos is not None:                                                  # same document: positions continue
            assert int(pos[b, t + d]) == int(pos[b, t]) + d
        checked += 1
    assert checked > 0
    assert (labels[:, 1:] == -100).sum() > 0                                 # there is a prompt / user turn
    if fmt == "messages":                                                    # the second user turn is masked
        ids = batch["input_ids"][0]
        user = (ids == TOK.convert_tokens_to_ids("<user>")).nonzero().flatten()
        assert len(user) == 2 and labels[0, int(user[1]) + 1] == -100


# --------------------------------------------------------------------------- MuToRTrainer's guarantees through TRL
class _WithOffsets:
    """TRL's collator plus a fixed per-example offset choice, so different batchings sample the same offsets."""

    def __init__(self):
        self.inner = DataCollatorForLanguageModeling(pad_token_id=0)

    def __call__(self, features):
        batch = self.inner([{k: f[k] for k in ("input_ids", "labels")} for f in features])
        batch["offset_index"] = torch.tensor([f["offset_index"] for f in features])
        return batch


@pytest.mark.parametrize("cfg", [MuToRConfig(d_max=3, loss_weight=0.3), MultiTokenConfig(d_max=3, loss_weight=0.3)],
                         ids=["mutor", "multi-token"])
def test_gradient_accumulation_matches_one_big_batch(tmp_path, cfg):
    """1x4 and 2x2 give the same update: both losses are token-weighted over the accumulated batch."""
    data = dataset("prompt_completion", 8).add_column("offset_index", [i % 3 for i in range(8)])
    states = []
    for bs, ga in ((4, 1), (2, 2)):
        trainer = MuToRSFTTrainer(
            model=tiny_causal_lm(V, seed=0), mutor_config=cfg, train_dataset=data, processing_class=TOK,
            data_collator=_WithOffsets(),
            args=_args(tmp_path / f"{bs}x{ga}", max_steps=2, per_device_train_batch_size=bs,
                       gradient_accumulation_steps=ga, optim="sgd", learning_rate=0.1, max_grad_norm=0.0,
                       remove_unused_columns=False, shuffle_dataset=False))
        trainer.train()
        states.append(_state(trainer.model))
    _assert_same(*states, atol=2e-6)


def test_resume_continues_exactly(tmp_path):
    """4 steps straight == a run stopped after checkpoint-2 and resumed by a new trainer (offsets included)."""
    from safetensors.torch import load_file

    def run(out, resume=None):
        trainer = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), train_dataset=dataset("prompt_completion"),
                                  processing_class=TOK, mutor_config=MuToRConfig(d_max=3, loss_weight=0.3),
                                  args=_args(out, max_steps=4, save_strategy="steps", save_steps=2))
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model()
        return trainer

    a, b = tmp_path / "a", tmp_path / "b"
    run(a)
    b.mkdir()
    shutil.copytree(a / "checkpoint-2", b / "checkpoint-2")
    assert (a / "checkpoint-2" / "mutor.safetensors").is_file()
    resumed = run(b, resume=str(b / "checkpoint-2"))
    assert resumed.state.global_step == 4
    for f in ("model.safetensors", "mutor.safetensors"):
        _assert_same(load_file(str(a / f)), load_file(str(b / f)), atol=0.0)


# --------------------------------------------------------------------------- checkpoints
def test_save_model_is_a_vanilla_checkpoint_plus_sidecar(tmp_path):
    trainer = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), args=_args(tmp_path, max_steps=2),
                              train_dataset=dataset("text"), eval_dataset=dataset("text", 8), processing_class=TOK,
                              mutor_config=MuToRConfig(d_max=3, loss_weight=0.3))
    trainer.train()
    metrics = trainer.evaluate()                                             # SFTTrainer's evaluation loop
    assert {"eval_loss", "eval_ntp_loss", "eval_reg_loss", "eval_entropy", "eval_mean_token_accuracy"} <= set(metrics)
    out = tmp_path / "final"
    trainer.save_model(str(out))
    assert (out / "mutor.safetensors").is_file() and (out / "mutor_config.json").is_file()
    assert (out / "tokenizer_config.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(plain).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([[7, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, trainer.plain_model().eval()(input_ids=ids).logits)
    again = MuToRModel.from_pretrained(str(out))
    torch.testing.assert_close(again.register_embeddings.weight, trainer.model.register_embeddings.weight)


def test_model_id_with_peft_config_saves_adapter_and_sidecar(tmp_path):
    """A model id (a local directory) plus peft_config, as TRL users write it: SFTTrainer builds and adapts the
    model, only LoRA weights and the register vector train, and the adapter directory loads back."""
    from peft import LoraConfig

    base_dir = tmp_path / "base"
    tiny_causal_lm(V, seed=0).save_pretrained(str(base_dir))
    TOK.save_pretrained(str(base_dir))
    trainer = MuToRSFTTrainer(model=str(base_dir), args=_args(tmp_path / "run", max_steps=2),
                              train_dataset=dataset("prompt_completion"),
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                              mutor_config=MuToRConfig(d_max=3, loss_weight=0.3))
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n == "register_embeddings.weight" for n in trainable)
    before = _state(trainer.model)
    trainer.train()
    after = _state(trainer.model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert "register_embeddings.weight" in changed and all("lora_" in k or "register" in k for k in changed)
    out = tmp_path / "adapter"
    trainer.save_model(str(out))
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert (out / "mutor.safetensors").is_file() and not (out / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()          # base from the adapter's config
    ids = torch.tensor([[7, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trainer.plain_model().eval()(input_ids=ids).logits)
    again = MuToRModel.from_pretrained(str(out))
    torch.testing.assert_close(again.register_embeddings.weight, trainer.model.register_embeddings.weight)


# --------------------------------------------------------------------------- other doors in, and refusals
def test_a_prebuilt_wrapper_and_the_multi_token_baseline(tmp_path):
    """A MuToRModel built by hand (here with the chunked loss) goes in as `model`; MultiTokenConfig trains the
    Multi-Token baseline through the same door. Neither returns logits, so entropy/accuracy are not logged."""
    wrapper = MuToRModel(tiny_causal_lm(V, seed=0), MuToRConfig(d_max=3, loss_weight=0.3), loss_chunk_size=8)
    t1 = MuToRSFTTrainer(model=wrapper, args=_args(tmp_path / "w", max_steps=2), train_dataset=dataset("text"),
                         processing_class=TOK)
    assert t1.model is wrapper
    t1.train()
    t2 = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), args=_args(tmp_path / "mt", max_steps=2),
                         train_dataset=dataset("text"), processing_class=TOK,
                         mutor_config=MultiTokenConfig(d_max=3, loss_weight=0.3))
    assert isinstance(t2.model, MultiTokenModel)
    t2.train()
    for t in (t1, t2):
        log = _train_logs(t)[-1]
        assert log["reg_loss"] > 0 and log["ntp_loss"] > 0 and "entropy" not in log


@pytest.mark.parametrize("kw, error, match", [
    ({}, TypeError, "needs mutor_config"),
    ({"mutor_config": {"d_max": 3}}, TypeError, "needs mutor_config"),
    ({"loss_type": "dft"}, ValueError, "loss_type='dft'"),
    ({"label_smoothing_factor": 0.1}, ValueError, "label_smoothing_factor"),
    ({"compute_loss_func": lambda *a, **k: 0}, ValueError, "compute_loss_func"),
])
def test_bad_input_fails_with_a_named_error(tmp_path, kw, error, match):
    kw = dict(kw)
    cfg = kw.pop("mutor_config", MuToRConfig() if kw else None)
    trainer_kw = {"compute_loss_func": kw.pop("compute_loss_func")} if "compute_loss_func" in kw else {}
    with pytest.raises(error, match=match):
        MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), args=_args(tmp_path, **kw), train_dataset=dataset("text"),
                        processing_class=TOK, mutor_config=cfg, **trainer_kw)


def test_a_wrapper_and_a_config_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        MuToRSFTTrainer(model=MuToRModel(tiny_causal_lm(V, seed=0)), mutor_config=MuToRConfig(),
                        args=_args(tmp_path), train_dataset=dataset("text"), processing_class=TOK)
