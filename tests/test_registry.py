"""The method registry: every method's sidecar files are what its checkpoints hold, and a fourth method,
registered from outside, trains through ``mutor train``, saves, and is read back by the evaluation harness
without any other module naming it (the registry is the one place that lists methods)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from mutor.core.config import JsonConfig
from mutor.methods.next_token import NextTokenModel
from mutor.methods.registry import (
    METHODS,
    Method,
    get_method,
    method_names,
    method_of_config,
    method_of_run,
    register_method,
)
from mutor.models.presets import tiny_causal_lm

FIXTURE = Path(__file__).resolve().parents[1] / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl"


def test_the_three_methods_are_registered():
    assert method_names() == ("next_token", "mutor", "multi_token")
    assert [get_method(m).recipe_block for m in method_names()] == [None, "mutor", "multi_token"]


def test_unknown_method_is_named_with_the_closest():
    with pytest.raises(ValueError, match=r"unknown method 'mutr'.*did you mean 'mutor'"):
        get_method("mutr")


@pytest.mark.parametrize("name", ["next_token", "mutor", "multi_token"])
def test_sidecar_files_are_what_a_checkpoint_holds(tmp_path, name):
    method = get_method(name)
    model = method.wrapper_class(tiny_causal_lm(259, seed=0), method.config(prefix_attention="bidirectional"))
    model.save_pretrained(tmp_path)
    assert all((tmp_path / f).is_file() for f in method.sidecar_files)
    others = {f for m in METHODS.values() if m is not method for f in m.sidecar_files}
    assert not any((tmp_path / f).exists() for f in others)
    assert method_of_run(tmp_path) is method
    assert method_of_config(model.method_config) is method


def test_next_token_wrap_is_the_plain_model_when_nothing_differs():
    base = tiny_causal_lm(259, seed=0)
    nt = get_method("next_token")
    assert nt.wrap(base, nt.config()) is base
    assert isinstance(nt.wrap(base, nt.config(prefix_attention="bidirectional")), NextTokenModel)
    assert isinstance(nt.wrap(base, nt.config(), loss_chunk_size=4), NextTokenModel)


# ------------------------------------------------------------------ a fourth method, from outside
@dataclass
class HalfConfig(JsonConfig):
    prefix_attention: str = field(default="causal", metadata={"help": "as every method's"})


class HalfModel(NextTokenModel):
    """A toy method: half the next-token loss (its own config class and sidecar file)."""

    config_class, config_file, config_attr = HalfConfig, "half_config.json", "next_token_config"

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.loss = 0.5 * out.loss
        return out


@pytest.fixture
def half_method():
    method = register_method(Method("half", HalfModel, None, "half the next-token loss"))
    yield method
    del METHODS["half"]


def test_a_fourth_method_trains_saves_and_is_read_back(tmp_path, half_method):
    from mutor.eval.harness import run_info
    from mutor.run.train import run_recipe

    recipe = {"method": "half", "seed": 0, "prefix_attention": "bidirectional", "name": "half",
              "model": {"preset": "tiny-llama", "tokenizer": "byte"},
              "data": {"task": "gsm8k", "path": str(FIXTURE), "limit": 8},
              "training": {"max_steps": 2, "per_device_train_batch_size": 4, "learning_rate": 1e-3,
                           "logging_steps": 1, "report_to": [], "use_cpu": True, "disable_tqdm": True,
                           "dataloader_pin_memory": False, "output_dir": str(tmp_path / "half")}}
    out = run_recipe(recipe, quiet=True)
    run_dir = Path(out["output_dir"])                       # one method: the run's own directory
    assert (run_dir / "half_config.json").is_file()
    assert json.loads((run_dir / "half_config.json").read_text())["prefix_attention"] == "bidirectional"
    assert method_of_run(run_dir) is half_method
    assert run_info(str(run_dir))["prefix_attention"] == "bidirectional"
    assert out["runs"][0]["method"] == "half" and out["runs"][0]["global_step"] == 2
    assert torch.isfinite(torch.tensor(out["runs"][0]["train_loss"]))
