"""Building what a recipe names: tokenizer, base model (loaded, or a seeded random preset sized for the
task), LoRA and the training arguments (:class:`~mutor.integrations.trainer.MuToRTrainingArguments`); the method's
wrapper comes from :mod:`mutor.methods.registry`.
:mod:`mutor.run.train` runs them.

LoRA on a random-init base saves that base next to the run (peft records no base for a model
built from a config), and every adapter of the run records where its base is.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Optional

import torch

from ..data.registry import TrainingData
from ..methods.mutor import MuToRConfig
from ..models.loading import TORCH_DTYPES, from_pretrained, load_pretrained
from ..models.peft_utils import peft_quietly
from ..utils.errors import MutorUserError
from .arguments import ModelArgs, build_dataclass

__all__ = ["build_tokenizer", "build_base_model", "apply_lora", "training_arguments",
           "count_parameters", "rotary_grid", "save_random_lora_base", "record_lora_base", "LORA_BASE_DIR"]

# ------------------------------------------------------------------ building
def build_tokenizer(m: ModelArgs):
    """The recipe's tokenizer (``model.tokenizer``, else the model's own), or None for a tokenizer-less task."""
    if m.tokenizer == "none":
        return None
    name = m.tokenizer if m.tokenizer is not None else m.name_or_path
    if name is None:
        return None
    if m.tokenizer is None and Path(name).is_dir() and not any(
            (Path(name) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None                               # a local model of a tokenizer-less task (star graphs, images)
    if name == "byte":
        from ..models.tokenizers import byte_tokenizer

        return byte_tokenizer()
    from transformers import AutoTokenizer

    what = "model.tokenizer" if m.tokenizer is not None else "model.name_or_path's tokenizer"
    if m.tokenizer is None and not Path(name).expanduser().exists():
        what = "model.name_or_path"               # missing: the model itself, not only its tokenizer
    tok = from_pretrained(AutoTokenizer.from_pretrained, name, what, is_model=False)
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token             # right padding is masked anyway
    return tok


def build_base_model(m: ModelArgs, task: TrainingData, tokenizer=None, seed: int = 0,
                     register_reach: int = MuToRConfig.d_max) -> torch.nn.Module:
    """Load ``model.name_or_path``, or build a random ``model.preset`` sized for the task, seeded with ``seed``,
    with room for registers ``register_reach`` positions ahead (:meth:`Recipe.register_reach`)."""
    if m.name_or_path is not None:
        if m.config_overrides:
            raise ValueError("model.config_overrides only applies to random-init models (name_or_path: null)")
        return _positions(load_pretrained(m.name_or_path, m.dtype, m.attn_implementation, "model.name_or_path"), m,
                          task)
    from ..models.presets import tiny_causal_lm

    if task.vocab_size is not None:
        vocab = task.vocab_size
    elif tokenizer is not None:
        vocab = len(tokenizer)
    else:
        raise ValueError("the task gives no vocabulary size and there is no tokenizer; set model.tokenizer")
    max_pos = max(2048, (task.max_length or 0) + register_reach + 8)
    kw = dict(max_position_embeddings=max_pos, pad_token_id=task.pad_token_id, bos_token_id=task.bos_token_id,
              eos_token_id=task.eos_token_id)
    kw.update(m.config_overrides)
    torch.manual_seed(seed)
    model = tiny_causal_lm(vocab, m.preset, attn_implementation=m.attn_implementation, **kw)
    return _positions(model.to(TORCH_DTYPES[m.dtype]), m, task)


def rotary_grid(task: TrainingData) -> dict:
    """``use_rotary_2d`` arguments for the task's token grid (also what ``task_info.json`` records)."""
    grid = task.mutor_overrides
    if "grid_width" not in grid:
        raise ValueError("model.rotary_2d needs an image task (digits, image_codes): this task has no token grid")
    return {"width": int(grid["grid_width"]), "grid_start": int(grid.get("grid_start", 0))}


def _positions(model: torch.nn.Module, m, task: TrainingData) -> torch.nn.Module:
    """``model.rotary_2d``: swap in 2D rotary positions over the task's grid."""
    if not m.rotary_2d:
        return model
    from ..image.rotary2d import use_rotary_2d

    return use_rotary_2d(model, **rotary_grid(task))


def apply_lora(base: torch.nn.Module, lora: Optional[dict]) -> torch.nn.Module:
    """Wrap ``base`` in peft LoRA adapters configured by the recipe's ``lora`` block (``base`` itself when empty).

    Args:
        base: The model to adapt.
        lora: ``peft.LoraConfig`` fields (``task_type`` defaults to ``CAUSAL_LM``); None or empty: no LoRA.

    Returns:
        The peft model, or ``base``.

    Raises:
        ImportError: peft is not installed.
        MutorUserError: peft refuses the ``lora`` block (its own message).
    """
    if not lora:
        return base
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # pragma: no cover
        raise ImportError("recipe.lora needs peft: pip install -e '.[peft]' in the mutor checkout") from err
    cfg = dict(lora)
    cfg.setdefault("task_type", "CAUSAL_LM")
    try:
        with peft_quietly():
            return get_peft_model(base, LoraConfig(**cfg))
    except (TypeError, ValueError) as err:
        raise MutorUserError(f"recipe lora: {err}") from None


def training_arguments(training: dict, seed: int, output_dir: Path, grad_clip: Optional[str] = None):
    """The run's training arguments: a recipe's ``training`` block over mutor's defaults (and its ``seed``).

    Args:
        training: The ``training`` block (fields of :class:`~mutor.integrations.trainer.MuToRTrainingArguments`).
        seed: The recipe's seed (``training.seed`` wins where given).
        output_dir: The method's output directory (``training.output_dir`` is the run's).
        grad_clip: The recipe's ``grad_clip``; None: the block's, else the default.

    Returns:
        The ``MuToRTrainingArguments``, read by ``HfArgumentParser``.

    Raises:
        MutorUserError: The arguments refuse a value (``transformers.TrainingArguments``' own message).
    """
    from ..integrations.trainer import MuToRTrainingArguments

    defaults = dict(output_dir=str(output_dir), seed=seed, logging_steps=10, save_strategy="steps",
                    save_steps=500, report_to=["tensorboard"], remove_unused_columns=False,
                    lr_scheduler_type="linear", weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0,
                    dataloader_pin_memory=torch.cuda.is_available())
    args = {**defaults, **training, "output_dir": str(output_dir)}
    if grad_clip is not None:
        args["grad_clip"] = grad_clip
    if args.get("bf16") and not torch.cuda.is_available():
        args.setdefault("use_cpu", True)        # Trainer's bf16 autocast runs on a CPU only when told use_cpu
    fields = {f.name for f in dataclasses.fields(MuToRTrainingArguments)}
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if old in args and new in fields and new not in args:   # the recipes' key, by its current name
            args[new] = args.pop(old)
    try:
        return build_dataclass(MuToRTrainingArguments, args)
    except (TypeError, ValueError) as err:
        raise MutorUserError(f"recipe training: {err} (fields of transformers.TrainingArguments)") from None


def count_parameters(model: torch.nn.Module) -> dict:
    """The model's parameter counts: ``{"total": ..., "trainable": ...}``."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "trainable": trainable}


LORA_BASE_DIR = "base"


def save_random_lora_base(base: torch.nn.Module, output_dir: Path) -> None:
    """LoRA on a random-init base: the base weights go to ``output_dir/base``, before LoRA wraps them.

    peft saves only the adapter, with ``base_model_name_or_path`` null for a model built from a
    config: without this copy the run could not be loaded at all. :func:`record_lora_base` then
    makes every adapter the run saves (checkpoints and the final one) record ``"base"``;
    :func:`mutor.utils.io.lora_base_dir` finds it beside the adapter or one level up (``checkpoint-N``).
    """
    base.save_pretrained(output_dir / LORA_BASE_DIR)


def record_lora_base(peft_model: torch.nn.Module, base: str) -> None:
    """What every adapter of the run records as its base: ``"base"`` (the saved random init) or a local
    base's absolute path (a relative one would only resolve from the training's working directory).

    With ``"base"`` the adapter is saved without the base's embedding layers (``save_embedding_layers=False``,
    unless a caller asks otherwise). peft's default (``"auto"``) saves them when the vocabulary was resized, and
    to find out reads ``config.json`` at ``base_model_name_or_path`` from the working directory or else the
    Hub, where ``"base"`` is neither: every save would query the network and warn. The run's ``base/`` already
    holds the embeddings the adapter was trained on, since mutor never resizes the vocabulary.
    """
    for cfg in peft_model.peft_config.values():
        cfg.base_model_name_or_path = base
    if base == LORA_BASE_DIR:
        peft_model.save_pretrained = functools.partial(peft_model.save_pretrained, save_embedding_layers=False)
