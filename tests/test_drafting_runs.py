"""Drafting from runs as ``mutor train`` writes them: a LoRA run of the tiny preset, saved without peft looking
its base up on the network, and the drafting page's LoRA snippet run as written on it.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from mutor.run.train import run_recipe

ROOT = Path(__file__).resolve().parents[1]
RUN = "runs/my-data/mutor"                                # the run the drafting page's LoRA snippet names


def _page_block(page: str, heading: str) -> str:
    """The first python block under ``heading`` (a whole line) of ``docs/<page>``."""
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n{heading}\n")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found, f"docs/{page}: no python block under {heading!r}"
    return found.group(1)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """``mutor train tiny/prompt-completion method=mutor lora.r=4`` for 2 steps, a checkpoint included; the
    warnings the training raised."""
    root = tmp_path_factory.mktemp("lora")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_recipe("tiny/prompt-completion", ["method=mutor", "lora.r=4", "training.max_steps=2",
                                              "training.save_steps=2", f"training.output_dir={root / RUN}"],
                   quiet=True)
    return root, [str(w.message) for w in caught]


def test_a_lora_run_of_the_tiny_preset_saves_without_looking_its_base_up(lora_run):
    root, said = lora_run
    for saved in (root / RUN, root / RUN / "checkpoint-2"):            # the final adapter and a checkpoint's
        assert (saved / "adapter_config.json").is_file() and (saved / "mutor_config.json").is_file()
    assert not [m for m in said if "config.json" in m or "config file" in m or "fetch" in m], said
    from safetensors.torch import load_file

    saved = load_file(str(root / RUN / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)                 # the adapter alone: no embedding layers


def test_the_lora_snippet_of_the_drafting_page_runs_as_written(lora_run, monkeypatch):
    """The snippet loads the adapter on the run's random-init base/ from outside the run's directory, and drafts
    losslessly: the merged model's own greedy tokens, and those of the unmerged peft model with the drafter."""
    import mutor

    root, _ = lora_run
    monkeypatch.chdir(root)
    block = _page_block("drafting.md", "### From a LoRA run")
    assert f'run = "{RUN}"' in block
    scope: dict = {}
    exec(compile(block, "docs/drafting.md:From a LoRA run", "exec"), scope)
    drafter, model, inputs, out = scope["drafter"], scope["model"], scope["inputs"], scope["out"]
    assert drafter.signature is not None and drafter.signature["hidden_size"] == 64   # its base's config, found
    assert drafter.last_stats.new_tokens == out.shape[1] - inputs.input_ids.shape[1]
    assert torch.equal(out, model.generate(**inputs, max_new_tokens=64, do_sample=False))
    peft_model = mutor.MuToRModel.from_pretrained(RUN).base_model.eval()
    assert torch.equal(peft_model.generate(**inputs, max_new_tokens=64, custom_generate=drafter), out)


def test_transformers_loads_a_random_base_lora_run_from_inside_its_directory(lora_run, monkeypatch):
    """What the drafting page says of ``AutoModelForCausalLM.from_pretrained(run)`` on a random-init base: it
    resolves ``"base"`` from the working directory, so it loads from inside the run's directory."""
    from transformers import AutoModelForCausalLM

    import mutor

    root, _ = lora_run
    monkeypatch.chdir(root / RUN)
    model = AutoModelForCausalLM.from_pretrained(".").eval()
    drafter = mutor.RegisterDrafter.from_pretrained(".", draft_registers=2)
    ids = torch.tensor([[52, 71, 88, 71, 84, 85, 71, 28]])
    assert torch.equal(model.generate(ids, max_new_tokens=8, custom_generate=drafter),
                       model.generate(ids, max_new_tokens=8, do_sample=False))
