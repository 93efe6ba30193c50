"""Checkpoints under FSDP / DeepSpeed ZeRO-3 are written from the gathered state dict, not the live parameters.

Under FSDP (and ZeRO-3) each rank holds a shard of every parameter (rank 1's shard of the one
register vector is empty); Trainer gathers the full state dict and hands it to ``_save``. The
wrappers' ``save_pretrained(path, state_dict=...)`` write both the base model (a vanilla
checkpoint) and the sidecar (register embeddings / Multi-Token heads) from that state dict.

Fast tests: a state dict that differs from the live parameters must be what is written, through
``save_pretrained`` and through ``MuToRTrainer._save`` (the call Trainer makes under FSDP/DeepSpeed).

Slow tests: a real 2-process FSDP2 run (torch ``fully_shard`` on gloo, driven by MuToRTrainer through
accelerate) against a 1-process run with the doubled batch, and a resume from its checkpoint.
accelerate 1.15 enables FSDP only for GPU-like device types: ``AcceleratorState.__init__`` switches
to ``DistributedType.FSDP`` only when the type is MULTI_GPU / MULTI_XPU / MULTI_NPU / ... and
MULTI_CPU is not in that list, so with ``use_cpu=True`` it silently drops the FSDP plugin and trains
with DDP (measured: ``distributed_type MULTI_CPU``, ``Trainer.is_fsdp_enabled False``, the model
wrapped in ``DistributedDataParallel``). torch's FSDP2 itself runs on CPU with gloo, so the worker
below (this file run by torchrun) turns that one switch back on (``_let_accelerate_run_fsdp_on_cpu``)
and checks that the parameters really are sharded DTensors; everything else is the unmodified
Trainer + accelerate FSDP2 path (``get_state_dict`` gather, ``save_fsdp_model`` /
``load_fsdp_model`` / optimizer state on resume).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from mutor import MuToRConfig, MuToRModel
from mutor.methods.multi_token import MT_WEIGHTS, MultiTokenConfig, MultiTokenModel
from mutor.methods.mutor import SIDECAR_WEIGHTS

VOCAB = 61


def _base(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def _wrapper(kind: str) -> torch.nn.Module:
    if kind == "mutor":
        return MuToRModel(_base(), MuToRConfig(d_max=2, min_offset=2, loss_weight=0.3))
    return MultiTokenModel(_base(), MultiTokenConfig(d_max=2, loss_weight=0.1))


SIDECAR = {"mutor": SIDECAR_WEIGHTS, "multi_token": MT_WEIGHTS}
OWN_PREFIX = {"mutor": "", "multi_token": "heads."}       # sidecar key = state-dict key minus this prefix


def _gathered_unlike_live(model: torch.nn.Module) -> dict:
    """The wrapper's state dict with every tensor changed: what a gather returns when live tensors are shards."""
    g = torch.Generator().manual_seed(1)
    return {k: v.detach().clone() + torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def _assert_checkpoint_holds(path: Path, kind: str, sd: dict, model: torch.nn.Module) -> None:
    base = load_file(str(path / "model.safetensors"))
    side = load_file(str(path / SIDECAR[kind]))
    side.pop("generator_state", None)
    expect_base = {k[len("base_model."):]: v for k, v in sd.items() if k.startswith("base_model.")}
    expect_side = {k[len(OWN_PREFIX[kind]):]: v for k, v in sd.items() if not k.startswith("base_model.")}
    assert set(base) == set(expect_base) and set(side) == set(expect_side)
    for k, v in {**base, **side}.items():
        want = expect_base[k] if k in base else expect_side[k]
        assert torch.equal(v, want), k
    live = {**{f"base_model.{k}": v for k, v in base.items()}, **{OWN_PREFIX[kind] + k: v for k, v in side.items()}}
    assert not any(torch.equal(v, model.state_dict()[k]) for k, v in live.items())   # nothing came from the live model
    # the base part is a vanilla checkpoint, and the wrapper reloads the sidecar's values
    plain = AutoModelForCausalLM.from_pretrained(path)
    for k, v in plain.state_dict().items():
        assert torch.equal(v, expect_base[k]), k
    reloaded = (MuToRModel if kind == "mutor" else MultiTokenModel).from_pretrained(path)
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, sd[k]), k


@pytest.mark.parametrize("kind", ["mutor", "multi_token"])
def test_save_pretrained_writes_the_gathered_state_dict_not_the_live_parameters(kind, tmp_path):
    model = _wrapper(kind)
    sd = _gathered_unlike_live(model)
    model.save_pretrained(tmp_path / "ckpt", state_dict=sd)
    _assert_checkpoint_holds(tmp_path / "ckpt", kind, sd, model)


@pytest.mark.parametrize("kind", ["mutor", "multi_token"])
def test_trainer_save_with_a_gathered_state_dict_writes_its_values(kind, tmp_path):
    from transformers import TrainingArguments

    from mutor.integrations.trainer import MuToRTrainer

    model = _wrapper(kind)
    trainer = MuToRTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True,
                                                               report_to=[]))
    sd = _gathered_unlike_live(model)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "optimizer.pt").write_bytes(b"kept")        # Trainer's own files in the same directory
    trainer._save(str(tmp_path / "ckpt"), state_dict=sd)             # what Trainer.save_model does under FSDP
    _assert_checkpoint_holds(tmp_path / "ckpt", kind, sd, model)
    assert (tmp_path / "ckpt" / "optimizer.pt").read_bytes() == b"kept"
    # DeepSpeed ZeRO-3 without a 16-bit gather hands _save an empty dict: a clear error, no placeholder written
    with pytest.raises(ValueError, match="zero3_save_16bit_model"):
        trainer._save(str(tmp_path / "empty"), state_dict={})


def test_save_pretrained_refuses_a_state_dict_that_is_not_the_wrappers(tmp_path):
    model = _wrapper("mutor")
    sd = model.state_dict()
    no_reg = {k: v for k, v in sd.items() if k != "register_embeddings.weight"}
    with pytest.raises(ValueError, match=r"missing \['register_embeddings.weight'\]"):
        model.save_pretrained(tmp_path / "a", state_dict=no_reg)
    base_only = {k[len("base_model."):]: v for k, v in sd.items() if k.startswith("base_model.")}
    with pytest.raises(ValueError, match="not this wrapper's full state dict"):
        model.save_pretrained(tmp_path / "b", state_dict=base_only)
    mt = _wrapper("multi_token")
    no_head = {k: v for k, v in mt.state_dict().items() if not k.startswith("heads.0.mlp")}
    with pytest.raises(ValueError, match=r"missing \['heads.0.mlp"):
        mt.save_pretrained(tmp_path / "c", state_dict=no_head)
    assert not any((tmp_path / d).exists() for d in "abc")


# ------------------------------------------------------------- 2 processes
def _torchrun() -> str:
    return os.path.join(os.path.dirname(sys.executable), "torchrun")


def _run(out: Path, kind: str, fsdp: bool, resume: Path | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    args = [str(Path(__file__)), "--out", str(out), "--kind", kind] + (["--resume", str(resume)] if resume else [])
    if fsdp:
        cmd = [_torchrun(), "--standalone", "--nproc_per_node", "2"] + args          # --standalone: a free port
        cmd += ["--fsdp", "--batch", "4"]
    else:
        cmd = [sys.executable] + args + ["--batch", "8"]
    subprocess.run(cmd, check=True, env=env, timeout=600)


def _files(path: Path, kind: str) -> dict:
    out = {f"base/{k}": v for k, v in load_file(str(path / "model.safetensors")).items()}
    side = load_file(str(path / SIDECAR[kind]))
    out.update({f"side/{k}": v for k, v in side.items() if k != "generator_state"})
    return out


def _assert_same(a: dict, b: dict, atol: float, rtol: float) -> None:
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=lambda m: f"{k}: {m}")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(_torchrun()), reason="torchrun not installed")
@pytest.mark.parametrize("kind", ["mutor", "multi_token"])
def test_two_process_fsdp_checkpoint_equals_one_process_and_resumes(kind, tmp_path):
    _run(tmp_path / "fsdp", kind, fsdp=True)
    _run(tmp_path / "one", kind, fsdp=False)
    # the worker trained on sharded parameters (rank 1 holds none of the 1-row register table, half the
    # rows of a Multi-Token head's weight), which save_pretrained must not write as they are
    info = json.loads((tmp_path / "fsdp" / "fsdp_info.json").read_text())
    assert info["is_fsdp2"] and info["param_type"] == "DTensor", info
    assert info["local_rows_rank1"] < info["rows"], info
    # final and step-2 checkpoints, base and sidecar, equal the one-process run's. Only the order of the
    # gradient reduction differs (two half-batch sums vs one); measured up to 2.5e-6 after 4 AdamW steps,
    # while one AdamW step moves a weight by about lr = 1e-3
    for sub in ("", "checkpoint-2"):
        _assert_same(_files(tmp_path / "fsdp" / sub, kind), _files(tmp_path / "one" / sub, kind), 1e-5, 1e-5)
    assert (tmp_path / "fsdp" / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()   # FSDP's own resume file
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp")                  # a vanilla checkpoint
    base = load_file(str(tmp_path / "fsdp" / "model.safetensors"))
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in base.items())
    # resuming the FSDP run from its step-2 checkpoint ends where the uninterrupted run ended
    # (same ranks, same reduction order: measured bit-identical), with the same losses at steps 3 and 4
    _run(tmp_path / "resumed", kind, fsdp=True, resume=tmp_path / "fsdp" / "checkpoint-2")
    _assert_same(_files(tmp_path / "resumed", kind), _files(tmp_path / "fsdp", kind), 1e-7, 1e-6)
    # separate clipping on FSDP2 shards: the same model and register/head norms as one process, clipping every step
    sharded = json.loads((tmp_path / "fsdp" / "fsdp_info.json").read_text())["norms_by_step"]
    single = json.loads((tmp_path / "one" / "fsdp_info.json").read_text())["norms_by_step"]
    assert set(sharded) == set(single) == {"1", "2", "3", "4"}
    for step in sharded:
        assert sharded[step][2] == single[step][2] == 1.0, (step, sharded, single)
        for x, y in zip(sharded[step][:2], single[step][:2]):
            assert x == pytest.approx(y, rel=1e-4), (step, sharded, single)
    full = json.loads((tmp_path / "fsdp" / "fsdp_info.json").read_text())["loss_by_step"]
    resumed = json.loads((tmp_path / "resumed" / "fsdp_info.json").read_text())["loss_by_step"]
    assert set(resumed) == set(full) == {"1", "2", "3", "4"}      # steps 1-2 come from the checkpoint's state
    for step in ("3", "4"):
        assert abs(resumed[step] - full[step]) <= 1e-6 * abs(full[step]), (step, resumed, full)


# ------------------------------------------------------------------ worker
def _let_accelerate_run_fsdp_on_cpu() -> None:
    """Make accelerate keep the FSDP plugin on CPU (see the module docstring for why it drops it)."""
    import accelerate.state as acc_state

    init = acc_state.AcceleratorState.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin") or getattr(self, "fsdp_plugin", None)
        if plugin is not None and self.distributed_type == acc_state.DistributedType.MULTI_CPU:
            self.distributed_type = acc_state.DistributedType.FSDP      # sticky: AcceleratorState() is re-entered
            self.fsdp_plugin = plugin

    acc_state.AcceleratorState.__init__ = patched


def _dataset(n: int = 32, seed: int = 0):
    """Right-padded prompt/answer rows of unequal lengths (labels -100 on prompt and padding)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    T = 16
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for _ in range(n):
        length = int(torch.randint(8, T + 1, (), generator=g))
        prompt = int(torch.randint(0, 4, (), generator=g))
        ids = torch.randint(3, VOCAB, (T,), generator=g)
        ids[length:] = 0
        rows["input_ids"].append(ids.tolist())
        rows["attention_mask"].append([1] * length + [0] * (T - length))
        rows["labels"].append([-100] * prompt + ids[prompt:length].tolist() + [-100] * (T - length))
    return Dataset.from_dict(rows)


def _worker(argv: list[str]) -> None:
    import argparse

    from transformers import TrainerCallback, TrainingArguments

    from mutor.integrations.trainer import MuToRTrainer
    from mutor.run.teardown import end_process, in_process_group, leave_process_group

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--kind", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--resume")
    a = p.parse_args(argv)
    fsdp = {}
    if a.fsdp:
        _let_accelerate_run_fsdp_on_cpu()
        fsdp = dict(fsdp=True, fsdp_config={"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                            "state_dict_type": "FULL_STATE_DICT", "reshard_after_forward": True})
    model = _wrapper(a.kind)
    args = TrainingArguments(output_dir=a.out, max_steps=4, per_device_train_batch_size=a.batch, use_cpu=True,
                             save_strategy="steps", save_steps=2, optim="adamw_torch", learning_rate=1e-3,
                             lr_scheduler_type="linear", logging_steps=1, report_to=[], seed=0,
                             max_grad_norm=0.05,            # separate clipping binds, on DTensor shards under FSDP2
                             remove_unused_columns=False, disable_tqdm=True, **fsdp)
    trainer = MuToRTrainer(model=model, args=args, train_dataset=_dataset())
    info: dict = {"is_fsdp2": bool(trainer.is_fsdp_enabled and trainer.accelerator.is_fsdp2)}

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            w = trainer.accelerator.unwrap_model(trainer.model)
            param = w.register_embeddings.weight if a.kind == "mutor" else w.heads[0].mlp.down_proj.weight
            info["param_type"] = type(param).__name__
            info["rows"] = int(param.shape[0])
            local = param.to_local() if type(param).__name__ == "DTensor" else param
            rows = torch.tensor([int(local.shape[0])])
            if torch.distributed.is_initialized():
                rows = [torch.zeros_like(rows) for _ in range(2)]
                torch.distributed.all_gather(rows, torch.tensor([int(local.shape[0])]))
            info["local_rows_rank1"] = int(rows[-1])

    trainer.add_callback(Probe())
    trainer.train(resume_from_checkpoint=a.resume)
    trainer.save_model(a.out)
    info["loss_by_step"] = {str(h["step"]): h["loss"] for h in trainer.state.log_history if "loss" in h}
    info["norms_by_step"] = {str(h["step"]): [h["grad_norm"], h["reg_grad_norm"], h["grad_clipped"]]
                             for h in trainer.state.log_history if "loss" in h}
    if trainer.args.should_save:
        (Path(a.out) / "fsdp_info.json").write_text(json.dumps(info))
    if in_process_group():                   # as `mutor train` ends a multi-process run (mutor.run.teardown)
        leave_process_group()
        end_process(0)


if __name__ == "__main__":
    _worker(sys.argv[1:])
