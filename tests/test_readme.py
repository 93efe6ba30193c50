"""The README's code runs as written: the Quickstart block, the own-data recipe, the recipe it points to, and the
drafting block on the run that recipe writes.

The blocks are read from README.md itself, so a change to the README that breaks them fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mutor.run.recipe import load_recipe
from mutor.run.train import run_recipe

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _block(section: str, language: str) -> str:
    """The first fenced ``language`` block under the README heading ``## section``."""
    start = README.index(f"\n## {section}\n")
    end = README.find("\n## ", start + 1)
    found = re.search(rf"```{language}\n(.*?)```", README[start:end if end != -1 else None], re.S)
    assert found, f"README section {section!r} has no {language} block"
    return found.group(1)


def test_the_quickstart_block_runs_as_written(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from mutor import MuToRModel

    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_block("Quickstart", "python"), "README.md:Quickstart", "exec"), scope)
    out = scope["out"]
    assert int(out.num_registers) > 0                       # registers were placed, in the answer only
    assert (tmp_path / "ckpt" / "mutor.safetensors").is_file()
    assert isinstance(scope["plain"], type(AutoModelForCausalLM.from_pretrained("ckpt")))
    assert isinstance(scope["again"], MuToRModel)
    assert scope["base"].model.embed_tokens.weight.grad is not None   # the backward reached the base model


def test_the_own_data_recipe_in_the_readme_is_a_valid_recipe(tmp_path):
    """Every key of the README's own-data recipe is one a recipe accepts (the model is not loaded)."""
    data = yaml.safe_load(_block("Your own data", "yaml"))
    assert data["data"]["task"] == "prompt_completion"
    recipe = load_recipe(data)
    assert recipe.method == ["next_token", "mutor"]
    assert recipe.data["prompt_template"] == "{prompt}\nAnswer:"


def test_the_shipped_prompt_completion_recipe_trains(tmp_path):
    """configs/tiny/prompt-completion.yaml, which the README points to, trains on its own JSONL."""
    results = run_recipe("tiny/prompt-completion", ["method=mutor", "training.max_steps=2", "training.save_steps=2",
                                                    f"training.output_dir={tmp_path / 'run'}"], quiet=True)
    assert (tmp_path / "run" / "summary.json").is_file(), results


def test_the_drafting_block_runs_as_written(tmp_path, monkeypatch, capsys):
    """The drafting block, on the run it names: the MuToR run of ``mutor train tiny/prompt-completion``, trained
    here for 2 steps (the recipe's own 20 steps and its next-token run change nothing the block does)."""
    monkeypatch.chdir(tmp_path)
    run = Path("runs/tiny-prompt-completion/mutor")
    run_recipe("tiny/prompt-completion", ["method=mutor", "training.max_steps=2", "training.save_steps=2",
                                          f"training.output_dir={run}"], quiet=True)
    block = _block("Registers as drafters", "python")
    assert f'run = "{run}"' in block
    capsys.readouterr()
    scope: dict = {}
    exec(compile(block, "README.md:Registers as drafters", "exec"), scope)
    stats = scope["drafter"].last_stats
    assert stats is not None and stats.new_tokens == scope["out"].shape[1] - scope["inputs"].input_ids.shape[1]
    assert capsys.readouterr().out.count("\n") >= 2                    # the answer and the counts were printed
