"""Sequences against the model's positions, and held-out losses that add up, as a user meets them.

* A recipe whose rows can be longer than the model's positions is refused in one line naming both numbers and
  both keys (a GPT-2 with learned positions would end in an index error; a Llama would train past its positions
  silently); ``data.truncate_to_model: true`` cuts the rows instead and says so in one line. ``mutor eval`` refuses
  a prompt plus ``--max-new-tokens`` that would run past the positions the same way.
* Held-out losses are weighted as training weights them: next-token's ``eval_loss`` is its ``eval_ntp_loss``, the
  mean over every supervised token of the set; MuToR's and Multi-Token's ``eval_loss`` is
  ``(1-a) * eval_ntp_loss + a * eval_reg_loss``, each over the whole set.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mutor.run.cli import main
from mutor.run.train import run_recipe
from mutor.testing import byte_tokenizer
from mutor.utils.errors import MutorUserError

DATA = Path(__file__).resolve().parents[1] / "src/mutor/configs/tiny/data"
TRAIN = {"max_steps": 1, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "report_to": [],
         "use_cpu": True, "save_strategy": "no", "disable_tqdm": True, "dataloader_pin_memory": False}


def _gpt2(path: Path, positions: int) -> str:
    """A tiny GPT-2 (learned position embeddings, ``n_positions``) over the byte tokenizer, saved with it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = byte_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=positions, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _long_rows(path: Path, n: int = 12) -> str:
    """Prompt/completion rows of 40-60 prompt tokens; every other completion is 200 bytes long."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": "p" * (40 + i), "completion": "c" * (200 if i % 2 == 0 else 20)}) + "\n")
    return str(path)


def _one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.startswith("mutor ")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ lengths
def test_gpt2_with_too_few_positions_is_refused_in_one_line_from_the_cli(tmp_path):
    """The user's case: a tiny GPT-2 (n_positions 64) and data.max_length 1024 ended in an IndexError traceback."""
    model, out = _gpt2(tmp_path / "gpt2", 64), tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"method": "next_token", "model": {"name_or_path": model},
                                  "data": {"task": "prompt_completion", "path": _long_rows(tmp_path / "d.jsonl"),
                                           "max_length": 1024},
                                  "training": {**TRAIN, "output_dir": str(out)}}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    p = subprocess.run([sys.executable, "-m", "mutor", "train", str(recipe)], capture_output=True, text=True,
                       env=env, timeout=300, check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    line = _one_line(p.stderr)
    for needle in ("mutor train: data.max_length 1024", "64 positions", "n_positions",
                   "data.truncate_to_model: true"):
        assert needle in line, (needle, line)
    assert not out.exists()                                       # nothing half-written


def test_llama_with_too_few_positions_is_refused_not_trained_silently(tmp_path, capsys):
    """A rotary model would run past max_position_embeddings without an error: refused too, naming the task's
    default max_length when the recipe sets none."""
    argv = ["train", "tiny/prompt-completion", "method=mutor", "model.config_overrides={max_position_embeddings: 96}",
            "--output-dir", str(tmp_path / "run")]
    capsys.readouterr()
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    for needle in ("mutor train: data.max_length 256 exceeds the model's 96 positions",
                   "max_position_embeddings in its config", "lower data.max_length to 96 or less",
                   "data.truncate_to_model: true"):
        assert needle in line, (needle, line)
    # without data.max_length in the recipe: the task's own default, said to be one
    recipe = {"method": "next_token", "model": {"preset": "tiny-llama", "tokenizer": "byte",
                                                "config_overrides": {"max_position_embeddings": 96}},
              "data": {"task": "prompt_completion", "path": str(DATA / "prompt_completion_tiny.jsonl")},
              "training": {**TRAIN, "output_dir": str(tmp_path / "run2")}}
    with pytest.raises(MutorUserError, match=r"data.max_length 512 \(the task's default\) exceeds the model's 96"):
        run_recipe(recipe, quiet=True)
    assert not (tmp_path / "run").exists() and not (tmp_path / "run2").exists()


def test_truncate_to_model_cuts_the_rows_with_a_notice(tmp_path, capsys):
    """data.truncate_to_model: true cuts training and held-out rows to the positions, says how many in one line,
    and MuToR trains and evaluates on them (registers stay within the cut rows)."""
    model, data, out = _gpt2(tmp_path / "gpt2", 128), _long_rows(tmp_path / "d.jsonl"), tmp_path / "run"
    recipe = {"method": "mutor", "mutor": {"d_max": 4, "loss_weight": 0.3}, "model": {"name_or_path": model},
              "data": {"task": "prompt_completion", "path": data, "eval_path": data, "max_length": 1024,
                       "truncate_to_model": True},
              "training": {**TRAIN, "output_dir": str(out), "eval_strategy": "steps", "eval_steps": 1}}
    capsys.readouterr()
    run = run_recipe(recipe)["runs"][0]
    notices = [x for x in capsys.readouterr().out.splitlines() if "truncate_to_model" in x]
    assert notices == [("[mutor train] data.truncate_to_model: 6 of 12 training rows and 6 of 12 held-out rows "
                        "cut to the model's 128 positions (n_positions)")]
    assert run["data"]["cut_to_model"] == 6 and run["data"]["model_positions"] == 128
    assert run["global_step"] == 1 and math.isfinite(run["eval_history"][-1]["eval_loss"])
    # a value other than true/false is refused before anything is built
    with pytest.raises(MutorUserError, match="data.truncate_to_model: must be true or false"):
        run_recipe({**recipe, "data": {**recipe["data"], "truncate_to_model": "maybe"},
                    "training": {**recipe["training"], "output_dir": str(tmp_path / "other")}}, quiet=True)


def test_truncate_to_model_refuses_rows_left_without_a_target(tmp_path):
    """Prompts alone longer than the positions: nothing would be left to learn, so the run is refused."""
    rows = tmp_path / "d.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "p" * 100, "completion": "c"}) + "\n" for _ in range(4)))
    recipe = {"method": "next_token", "model": {"name_or_path": _gpt2(tmp_path / "gpt2", 64)},
              "data": {"task": "prompt_completion", "path": str(rows), "truncate_to_model": True},
              "training": {**TRAIN, "output_dir": str(tmp_path / "run")}}
    with pytest.raises(MutorUserError, match="no training example keeps a next-token target"):
        run_recipe(recipe, quiet=True)


def test_eval_refuses_prompt_plus_new_tokens_past_the_positions(tmp_path, capsys):
    """mutor eval: a prompt plus --max-new-tokens past n_positions is one line naming the numbers (it was an
    IndexError inside the model), before anything is generated or written; a budget that fits runs."""
    model = _gpt2(tmp_path / "gpt2", 128)
    argv = ["eval", "--task", "gsm8k", "--model", model, "--data", str(DATA / "gsm8k_tiny.jsonl"), "--limit", "2",
            "--quiet", "--output-dir", str(tmp_path / "eval")]
    capsys.readouterr()
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("mutor eval: a prompt of ") and "max_new_tokens 512" in line, line
    assert "the model has 128 (n_positions in its config)" in line and "--max-new-tokens" in line, line
    assert not (tmp_path / "eval").exists()
    assert main(argv + ["--max-new-tokens", "4"]) == 0
    assert (tmp_path / "eval" / "summary.json").is_file()


# ------------------------------------------------------------------ eval losses
def _eval_recipe(method: str, out: Path, **extra) -> dict:
    """A tiny prompt/completion run with 13 held-out rows of uneven lengths (batches of 4: the last has one row)."""
    rows = str(DATA / "prompt_completion_tiny.jsonl")
    return {"method": method, "seed": 0, "model": {"preset": "tiny-llama", "tokenizer": "byte"},
            "mutor": {"d_max": 3, "loss_weight": 0.3}, "multi_token": {"d_max": 2, "loss_weight": 0.2},
            "data": {"task": "prompt_completion", "path": rows, "eval_path": rows, "eval_limit": 13,
                     "prompt_template": "{prompt}\nAnswer:", "completion_template": " {completion}"},
            "training": {**TRAIN, "max_steps": 3, "learning_rate": 1e-2, "output_dir": str(out),
                         "eval_strategy": "steps", "eval_steps": 3}, **extra}


def _plain_means(run_dir: Path, data: dict) -> tuple[float, float]:
    """The saved model's next-token loss over the held-out rows: (mean over every supervised token, mean of the
    per-batch means over batches of 4 as Trainer's own evaluation loop averages them)."""
    from transformers import AutoModelForCausalLM

    from mutor.data.registry import build_training_data

    model = AutoModelForCausalLM.from_pretrained(str(run_dir)).eval()
    task = build_training_data("prompt_completion", {k: v for k, v in data.items() if k != "task"},
                               byte_tokenizer(), 0)
    sums, counts = [], []
    with torch.no_grad():
        for ex in task.eval_dataset:
            labels = torch.tensor([ex["labels"]])
            counts.append(int((labels[:, 1:] != -100).sum()))
            sums.append(float(model(input_ids=torch.tensor([ex["input_ids"]]), labels=labels).loss) * counts[-1])
    batches = [(sum(sums[i:i + 4]), sum(counts[i:i + 4])) for i in range(0, len(sums), 4)]
    return sum(sums) / sum(counts), sum(s / n for s, n in batches) / len(batches)


@pytest.mark.parametrize("method, extra, a", [
    ("next_token", {}, 0.0),                                      # the plain model under Trainer
    ("next_token", {"prefix_attention": "bidirectional"}, 0.0),   # the NextTokenModel wrapper
    ("mutor", {}, 0.3),
    ("multi_token", {}, 0.2),
], ids=["next_token", "next_token-bidirectional", "mutor", "multi_token"])
def test_eval_losses_add_up(tmp_path, method, extra, a):
    recipe = _eval_recipe(method, tmp_path / "run", **extra)
    run = run_recipe(recipe, quiet=True)["runs"][0]
    h = run["eval_history"][-1]
    if a == 0:
        assert "eval_reg_loss" not in h
        assert h["eval_loss"] == pytest.approx(h["eval_ntp_loss"], abs=1e-5)
    else:
        assert h["eval_loss"] == pytest.approx((1 - a) * h["eval_ntp_loss"] + a * h["eval_reg_loss"], abs=1e-5)
    if method in ("next_token", "mutor") and not extra:
        # causal prompts: the regular tokens' loss is the saved plain model's, over every supervised token of the set
        token_mean, batch_mean = _plain_means(tmp_path / "run", recipe["data"])
        assert h["eval_ntp_loss"] == pytest.approx(token_mean, abs=1e-5)
        assert abs(batch_mean - token_mean) > 1e-4        # the set tells the two averages apart


def test_trl_eval_losses_add_up(tmp_path):
    """MuToRSFTTrainer evaluates through the same loop: its eval_loss is (1-a) * eval_ntp_loss + a * eval_reg_loss."""
    pytest.importorskip("trl")
    from test_trl import TOK, V, _args, dataset

    from mutor import MuToRConfig
    from mutor.integrations.trl import MuToRSFTTrainer
    from mutor.models.presets import tiny_causal_lm

    trainer = MuToRSFTTrainer(model=tiny_causal_lm(V, seed=0), args=_args(tmp_path, max_steps=1,
                                                                              per_device_eval_batch_size=3),
                              train_dataset=dataset("prompt_completion"), eval_dataset=dataset("prompt_completion", 7),
                              processing_class=TOK, mutor_config=MuToRConfig(d_max=3, loss_weight=0.3))
    trainer.train()
    m = trainer.evaluate()
    assert m["eval_loss"] == pytest.approx(0.7 * m["eval_ntp_loss"] + 0.3 * m["eval_reg_loss"], abs=1e-5)
