"""MuToRSFTTrainer across processes: 2-process DDP and FSDP2 (torchrun, gloo on CPU) end where one process with
the doubled batch ends, the register vector included, and log the same loss and clipping at every step.

The same argument as tests/test_distributed.py (MuToRTrainer): every rank sees half the global batch, the
token and register counts are gathered across ranks, so both losses stay token-weighted means over the global
batch. One offset (d_max = min_offset = 2) and SGD make the runs comparable weight by weight; max_grad_norm
0.05 makes separate clipping bind for the model and the register at every step. FSDP2 on CPU needs
accelerate's FSDP switch turned back on (tests/test_fsdp.py explains why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")


def _torchrun() -> str:
    return os.path.join(os.path.dirname(sys.executable), "torchrun")


def _run(out: Path, mode: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    args = [str(Path(__file__)), "--out", str(out), "--mode", mode]
    if mode == "one":
        cmd = [sys.executable] + args + ["--batch", "8"]
    else:
        cmd = [_torchrun(), "--standalone", "--nproc_per_node", "2"] + args + ["--batch", "4"]
    subprocess.run(cmd, check=True, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(_torchrun()), reason="torchrun not installed")
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_process_mutor_sfttrainer_equals_one_process_with_double_batch(mode, tmp_path):
    _run(tmp_path / mode, mode)
    _run(tmp_path / "one", "one")
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in (mode, "one"))
    if mode == "fsdp":
        assert a["is_fsdp2"], a
    assert a["steps"] == b["steps"] == [1, 2, 3]
    for x, y in zip(a["logs"], b["logs"]):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5), (x, y)
        assert x["reg_grad_norm"] == pytest.approx(y["reg_grad_norm"], rel=1e-4), (x, y)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4), (x, y)
        assert x["grad_clipped"] == y["grad_clipped"] == 1.0 and x["reg_grad_clipped"] == y["reg_grad_clipped"] == 1.0
    wa, wb = torch.load(tmp_path / mode / "weights.pt"), torch.load(tmp_path / "one" / "weights.pt")
    assert wa.keys() == wb.keys() and "register_embeddings.weight" in wa
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5, msg=lambda m: f"{k}: {m}")


# ------------------------------------------------------------------ worker
def _worker(argv: list[str]) -> None:
    import argparse

    from test_fsdp import _let_accelerate_run_fsdp_on_cpu
    from test_trl import V, _args, dataset, word_tokenizer

    from mutor import MuToRConfig
    from mutor.integrations.trl import MuToRSFTTrainer
    from mutor.models.presets import tiny_causal_lm
    from mutor.run.teardown import end_process, in_process_group, leave_process_group

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True, choices=["one", "ddp", "fsdp"])
    p.add_argument("--batch", type=int, required=True)
    a = p.parse_args(argv)
    fsdp = {}
    if a.mode == "fsdp":
        _let_accelerate_run_fsdp_on_cpu()
        fsdp = dict(fsdp=True, fsdp_config={"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                            "state_dict_type": "FULL_STATE_DICT", "reshard_after_forward": True})
    args = _args(a.out, max_steps=3, per_device_train_batch_size=a.batch, optim="sgd", learning_rate=0.1,
                 max_grad_norm=0.05, **fsdp)
    trainer = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), args=args, train_dataset=dataset("prompt_completion"),
                              processing_class=word_tokenizer(),
                              mutor_config=MuToRConfig(d_max=2, min_offset=2, loss_weight=0.3))
    trainer.train()
    state = trainer.accelerator.get_state_dict(trainer.model)       # gathered under FSDP, on every rank
    if trainer.args.should_save:
        logs = [h for h in trainer.state.log_history if "loss" in h]
        Path(a.out).mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu().clone() for k, v in state.items()}, Path(a.out) / "weights.pt")
        (Path(a.out) / "result.json").write_text(json.dumps({
            "is_fsdp2": bool(trainer.is_fsdp_enabled and trainer.accelerator.is_fsdp2),
            "steps": [h["step"] for h in logs],
            "logs": [{k: h[k] for k in ("loss", "grad_norm", "reg_grad_norm", "grad_clipped", "reg_grad_clipped")}
                     for h in logs]}))
    if in_process_group():                   # as `mutor train` ends a multi-process run (mutor.run.teardown)
        leave_process_group()
        end_process(0)


if __name__ == "__main__":
    _worker(sys.argv[1:])
