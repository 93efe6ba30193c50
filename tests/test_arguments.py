"""Typed configuration: recipe blocks read by HfArgumentParser's types, mutor's options as training arguments, and
the private Trainer names MuToRTrainer relies on, checked against the installed transformers and TRL.

Recipes are small YAML files written here; the trainer runs are a few steps of a tiny random model.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import transformers
from transformers import Trainer, TrainingArguments

from mutor.data.collator import PaddingCollator
from mutor.integrations.trainer import PRIVATE_TRAINER_NAMES, MuToRArguments, MuToRTrainer, MuToRTrainingArguments
from mutor.models.presets import tiny_causal_lm
from mutor.run.arguments import DataArguments, ModelArgs, RecipeKeyError, parse_block
from mutor.run.recipe import load_recipe
from mutor.utils.errors import MutorUserError

RECIPE = "method: mutor\nseed: 0\nmodel:\n  preset: tiny-llama\ndata:\n  task: gsm8k\n  max_length: 64\n" \
         "training:\n  max_steps: 3\n  learning_rate: 1.0e-3\n"


# ------------------------------------------------ private names of transformers
@pytest.mark.parametrize("name", PRIVATE_TRAINER_NAMES)
def test_each_private_trainer_name_mutor_uses_still_exists(name):
    """An upgrade of transformers that renames or reshapes one of them fails here, by name."""
    ours = getattr(MuToRTrainer, name, None)
    theirs = getattr(Trainer, name, None)
    if callable(theirs):
        assert callable(ours) and ours is not theirs, name                       # an override of a method
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name
    else:
        assert f"self.{name} =" in inspect.getsource(Trainer), name              # an attribute the loop sets


def test_each_private_sft_trainer_name_mutor_uses_still_exists():
    pytest.importorskip("trl")
    from trl import SFTTrainer

    from mutor.integrations.trl import PRIVATE_SFT_TRAINER_NAMES

    source = inspect.getsource(SFTTrainer)
    for name in PRIVATE_SFT_TRAINER_NAMES:
        assert callable(getattr(SFTTrainer, name, None)) or f"self.{name} =" in source, name


# ------------------------------------------------------ MuToRTrainingArguments
def test_training_arguments_carry_mutors_options():
    args = MuToRTrainingArguments("out", grad_clip="joint", task_eval_steps=0.5, use_cpu=True)
    assert isinstance(args, TrainingArguments) and args.output_dir == "out"          # output_dir stays first
    assert (args.grad_clip, args.task_eval_steps) == ("joint", 0.5)
    assert {"grad_clip", "task_eval_steps"} <= set(args.to_dict())
    (parsed,) = transformers.HfArgumentParser(MuToRTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "out", "--grad_clip", "joint", "--use_cpu", "true"])
    assert parsed.grad_clip == "joint" and parsed.task_eval_steps is None
    for f in dataclasses.fields(MuToRArguments):
        assert f.metadata.get("help"), f.name
    with pytest.raises(ValueError, match=r"grad_clip must be one of \['separate', 'joint'\]"):
        MuToRTrainingArguments("out", grad_clip="sometimes", use_cpu=True)
    with pytest.raises(ValueError, match="task_eval_steps"):
        MuToRTrainingArguments("out", task_eval_steps=-1, use_cpu=True)


def test_grad_clip_given_to_the_trainer_names_the_arguments(tmp_path):
    with pytest.raises(TypeError, match=r"MuToRTrainingArguments\(\.\.\., grad_clip="):
        MuToRTrainer(model=tiny_causal_lm(259, seed=0), args=TrainingArguments(str(tmp_path), use_cpu=True),
                     grad_clip="joint")


def test_task_evaluator_runs_every_task_eval_steps(tmp_path):
    rows = [{"input_ids": list(range(3, 11)), "labels": list(range(3, 11))} for _ in range(8)]
    steps = []
    args = MuToRTrainingArguments(str(tmp_path), max_steps=4, per_device_train_batch_size=2, report_to=[],
                                  save_strategy="no", use_cpu=True, disable_tqdm=True, eval_steps=3,
                                  task_eval_steps=2, dataloader_pin_memory=False)
    MuToRTrainer(model=tiny_causal_lm(259, seed=0), args=args, train_dataset=rows, data_collator=PaddingCollator(),
                 task_evaluator=lambda model, step: steps.append(step) or {"calls": 1.0}).train()
    assert steps == [0, 2, 4]                               # its own cadence, not eval_steps


# ---------------------------------------------------------------- the parser
def test_block_values_are_read_as_hfargumentparser_types_them():
    from mutor.integrations.trainer import MuToRTrainingArguments as T

    assert parse_block({"learning_rate": "2e-5", "bf16": "yes", "max_steps": 5, "report_to": [],
                        "eval_steps": None, "activation_checkpointing_kwargs": {"use_reentrant": False}}, T,
                       "training") == {"learning_rate": 2e-5, "bf16": True, "max_steps": 5, "report_to": [],
                                       "eval_steps": None, "activation_checkpointing_kwargs": {"use_reentrant": False}}
    for values, needle in [({"max_steps": "abc"}, "recipe training.max_steps: expected an integer, got 'abc'"),
                           ({"max_steps": True}, "expected an integer, got True"),
                           ({"max_steps": 2.5}, "expected an integer, got 2.5"),
                           ({"max_steps": None}, "expected an integer, got None"),
                           ({"learning_rate": [1]}, "expected a number, got [1]"),
                           ({"output_dir": 7}, "expected a string or null, got 7")]:
        with pytest.raises(RecipeKeyError, match=needle.replace("(", r"\(").replace("[", r"\[")) as err:
            parse_block(values, T, "training")
        assert err.value.key == f"training.{next(iter(values))}"
    assert parse_block({"config_overrides": {"hidden_size": 32}, "preset": None}, ModelArgs, "model") == \
        {"config_overrides": {"hidden_size": 32}, "preset": None}
    with pytest.raises(RecipeKeyError, match="recipe model.config_overrides: expected a mapping"):
        parse_block({"config_overrides": [1]}, ModelArgs, "model")
    with pytest.raises(RecipeKeyError, match=r"'presett': did you mean 'preset'\?"):
        parse_block({"presett": "x"}, ModelArgs, "model")


def test_a_class_argparse_cannot_fully_express_is_checked_field_by_field():
    """peft's LoraConfig has unions HfArgumentParser refuses: its other fields are still typed."""
    pytest.importorskip("peft")
    from peft import LoraConfig

    assert parse_block({"r": 8, "target_modules": "all-linear", "lora_alpha": "16"}, LoraConfig, "lora") == \
        {"r": 8, "target_modules": "all-linear", "lora_alpha": 16}
    with pytest.raises(RecipeKeyError, match="recipe lora.r: expected an integer, got 'x'"):
        parse_block({"r": "x"}, LoraConfig, "lora")


def test_data_arguments_keep_the_tasks_options_apart():
    data = DataArguments.from_block({"task": "gsm8k", "packing": True, "path": "x.jsonl", "max_length": 64})
    assert (data.task, data.packing, data.truncate_to_model) == ("gsm8k", True, False)
    assert data.options == {"path": "x.jsonl", "max_length": 64}


# --------------------------------------------------------------- recipe files
def _recipe(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("line, edit, needle", [
    (9, ("max_steps: 3", "max_steps: abc"), "recipe training.max_steps: expected an integer, got 'abc'"),
    (9, ("max_steps: 3", "max_stepz: 3"), "'max_stepz': did you mean 'max_steps'?"),
    (4, ("preset: tiny-llama", "dtype: 7"), "recipe model.dtype: expected a string, got 7"),
    (1, ("method: mutor", "methd: mutor"), "'methd': did you mean 'method'?"),
    (7, ("max_length: 64", "packing: maybe"), "recipe data.packing: expected true or false or null, got 'maybe'"),
])
def test_a_bad_key_of_a_recipe_file_is_named_with_its_file_and_line(tmp_path, line, edit, needle):
    path = _recipe(tmp_path, RECIPE.replace(*edit))
    with pytest.raises(MutorUserError) as err:
        load_recipe(path)
    assert str(err.value).startswith(f"{path}: line {line}: ") and needle in str(err.value), str(err.value)


def test_an_overridden_key_is_named_without_the_files_line(tmp_path):
    path = _recipe(tmp_path, RECIPE)
    with pytest.raises(MutorUserError) as err:
        load_recipe(path, ["training.max_steps=abc"])
    assert str(err.value) == "recipe training.max_steps: expected an integer, got 'abc'"


def test_recipe_gives_typed_training_arguments(tmp_path):
    r = load_recipe(_recipe(tmp_path, RECIPE), ["grad_clip=joint", "training.learning_rate=2e-5",
                                                "training.task_eval_steps=2"])
    args = r.training_arguments(tmp_path / "out")
    assert isinstance(args, MuToRTrainingArguments)
    assert (args.grad_clip, args.learning_rate, args.task_eval_steps, args.max_steps) == ("joint", 2e-5, 2, 3)
    assert r.training == {"max_steps": 3, "learning_rate": 2e-5, "task_eval_steps": 2}     # as written, checked
    assert r.data_arguments().options == {"max_length": 64}
    with pytest.raises(MutorUserError, match="recipe training.grad_clip: set grad_clip at the top of the recipe"):
        load_recipe(_recipe(tmp_path, RECIPE), ["training.grad_clip=joint"])


def test_a_recipe_round_trips_through_its_recorded_yaml(tmp_path):
    r = load_recipe(_recipe(tmp_path, RECIPE), ["training.bf16=yes"])
    again = load_recipe(_recipe(tmp_path, r.for_run("mutor").to_yaml()))
    assert again.to_dict() == r.to_dict() and again.training["bf16"] is True


def test_a_value_of_a_kind_the_annotation_takes_is_kept_as_written():
    """HfArgumentParser reads ``str | bool`` as a boolean and ``dict | str`` as a string: a YAML string, or mapping,
    that the annotation takes stays as written."""
    from mutor.integrations.trainer import MuToRTrainingArguments as T

    assert parse_block({"include_num_input_tokens_seen": "all", "lr_scheduler_kwargs": {"min_lr": 1e-5}}, T,
                       "training") == {"include_num_input_tokens_seen": "all", "lr_scheduler_kwargs": {"min_lr": 1e-5}}
    assert parse_block({"include_num_input_tokens_seen": True}, T, "training") == \
        {"include_num_input_tokens_seen": True}
