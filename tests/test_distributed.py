"""Two-process data parallel training (torchrun, gloo on CPU) equals one process with the doubled batch:
same final weights (DDP keeps the ranks identical; rank 0 saves) and the same logged loss at every step.

This is what makes multi-GPU runs honest: each rank sees half the batch, and the register
counts are gathered across ranks like Trainer's label-token counts, so both losses stay
token-weighted means over the global batch. A single offset choice (d_max = min_offset) and
SGD make the two runs comparable weight by weight.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

COMMON = ["tiny/gsm8k", "method=mutor", "mutor.d_max=2", "mutor.min_offset=2", "training.max_steps=2",
          "training.save_strategy=no", "training.optim=sgd", "training.learning_rate=0.05", "training.report_to=[]",
          "training.use_cpu=true", "training.logging_steps=1",
          "training.max_grad_norm=0.05", "--quiet"]        # separate clipping binds for the model and the register


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(os.path.join(os.path.dirname(
    sys.executable), "torchrun")), reason="torchrun not installed")
def test_two_process_ddp_equals_one_process_with_double_batch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "mutor", "train", *COMMON,
                    "training.per_device_train_batch_size=4", "--output-dir", str(tmp_path / "ddp")],
                   check=True, env=env, timeout=600)
    subprocess.run([sys.executable, "-m", "mutor", "train", *COMMON, "training.per_device_train_batch_size=8",
                    "--output-dir", str(tmp_path / "one")], check=True, env=env, timeout=600)
    for f in ("model.safetensors", "mutor.safetensors"):
        a, b = load_file(str(tmp_path / "ddp" / f)), load_file(str(tmp_path / "one" / f))
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    # the logged loss of every step (Trainer gathers it over ranks) is the single-process loss
    import json

    ddp = json.loads((tmp_path / "ddp" / "summary.json").read_text())["train_history"]
    one = json.loads((tmp_path / "one" / "summary.json").read_text())["train_history"]
    assert [h["step"] for h in ddp] == [h["step"] for h in one] == [1, 2]
    for x, y in zip(ddp, one):
        assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(y["loss"]), (x, y)
        assert x["grad_clipped"] == y["grad_clipped"] == 1.0 and x["reg_grad_clipped"] == 1.0
        assert x["reg_grad_norm"] == pytest.approx(y["reg_grad_norm"], rel=1e-4)
