"""MuToR under DeepSpeed ZeRO-3 on CPU (2 processes, gloo): the saved checkpoint, base model and register
sidecar, equals a 1-process ZeRO-3 run with doubled gradient accumulation, and a resumed run ends where the
uninterrupted one ended.

Slow, and only where DeepSpeed is installed (``pip install -e ".[deepspeed]"``). On a CPU, DeepSpeed needs
``deepspeed.init_distributed(dist_backend="gloo")`` before ``TrainingArguments`` (else every rank believes
it is alone and its batch-size check fails) and ``use_cpu=True``; its first run compiles a small
shared-memory op with g++ (about a minute, cached). DeepSpeed clips inside its engine, so mutor's
separate clipping is refused there and the run uses ``grad_clip="joint"`` (Trainer's clipping of all
parameters together, the official code's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402


def _torchrun() -> str:
    return os.path.join(os.path.dirname(sys.executable), "torchrun")


def _run(out: Path, procs: int, resume: Path | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    args = [str(Path(__file__)), "--out", str(out), "--accum", str(4 // (2 * procs))]
    args += ["--resume", str(resume)] if resume else []
    cmd = [_torchrun(), "--standalone", "--nproc_per_node", str(procs)] + args
    subprocess.run(cmd, check=True, env=env, timeout=900)


def _files(path: Path) -> dict:
    out = {f"base/{k}": v for k, v in load_file(str(path / "model.safetensors")).items()}
    side = load_file(str(path / "mutor.safetensors"))
    out.update({f"side/{k}": v for k, v in side.items() if k != "generator_state"})
    return out


def _assert_same(a: dict, b: dict, atol: float, rtol: float) -> None:
    assert set(a) == set(b) and "side/register_embeddings.weight" in a
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=lambda m: f"{k}: {m}")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(_torchrun()), reason="torchrun not installed")
def test_zero3_two_processes_equal_one_with_doubled_accumulation_and_resume(tmp_path):
    _run(tmp_path / "two", procs=2)
    _run(tmp_path / "one", procs=1)
    info = json.loads((tmp_path / "two" / "ds_info.json").read_text())
    assert info["zero_stage"] == 3 and info["world_size"] == 2, info
    for sub in ("", "checkpoint-2"):
        _assert_same(_files(tmp_path / "two" / sub), _files(tmp_path / "one" / sub), 1e-5, 1e-5)
    init, final = torch.load(tmp_path / "two" / "init.pt"), _files(tmp_path / "two")
    assert not torch.allclose(init["register_embeddings.weight"], final["side/register_embeddings.weight"])
    assert not torch.allclose(init["base_model.model.embed_tokens.weight"], final["base/model.embed_tokens.weight"])
    base = load_file(str(tmp_path / "two" / "model.safetensors"))
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "two")                 # a vanilla checkpoint
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in base.items())
    _run(tmp_path / "resumed", procs=2, resume=tmp_path / "two" / "checkpoint-2")
    _assert_same(_files(tmp_path / "resumed"), _files(tmp_path / "two"), 1e-6, 1e-6)
    full = json.loads((tmp_path / "two" / "ds_info.json").read_text())["loss_by_step"]
    resumed = json.loads((tmp_path / "resumed" / "ds_info.json").read_text())["loss_by_step"]
    for step in ("3", "4"):
        assert abs(resumed[step] - full[step]) <= 1e-6 * abs(full[step]), (step, resumed, full)


# ------------------------------------------------------------------ worker
def _worker(argv: list[str]) -> None:
    import argparse

    import deepspeed
    from test_fsdp import _base, _dataset

    from mutor import MuToRConfig, MuToRModel
    from mutor.integrations.trainer import MuToRTrainer, MuToRTrainingArguments
    from mutor.run.teardown import end_process, leave_process_group

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--resume")
    a = p.parse_args(argv)
    deepspeed.init_distributed(dist_backend="gloo")
    ds = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
          "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.0}},
          "zero_allow_untested_optimizer": True}
    args = MuToRTrainingArguments(output_dir=a.out, max_steps=4, per_device_train_batch_size=2,
                                  gradient_accumulation_steps=a.accum, use_cpu=True, save_strategy="steps",
                                  save_steps=2, learning_rate=1e-3, lr_scheduler_type="linear", logging_steps=1,
                                  report_to=[], seed=0, max_grad_norm=0.05, remove_unused_columns=False,
                                  disable_tqdm=True, deepspeed=ds, grad_clip="joint")
    model = MuToRModel(_base(), MuToRConfig(d_max=2, min_offset=2, loss_weight=0.3))
    if args.should_save and not a.resume:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, Path(a.out) / "init.pt")
    trainer = MuToRTrainer(model=model, args=args, train_dataset=_dataset())
    trainer.train(resume_from_checkpoint=a.resume)
    trainer.save_model(a.out)
    if trainer.args.should_save:
        engine = trainer.model_wrapped
        (Path(a.out) / "ds_info.json").write_text(json.dumps({
            "zero_stage": int(engine.zero_optimization_stage()), "world_size": int(torch.distributed.get_world_size()),
            "loss_by_step": {str(h["step"]): h["loss"] for h in trainer.state.log_history if "loss" in h}}))
    # As `mutor train` ends a multi-process run: the ranks leave the process group, then the process ends without
    # the interpreter's teardown, where the gloo groups DeepSpeed's objects still hold could abort it.
    leave_process_group()
    end_process(0)


if __name__ == "__main__":
    _worker(sys.argv[1:])
