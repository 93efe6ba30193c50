"""MuToRTrainer: ``transformers.Trainer`` that drives MuToR, the Multi-Token baseline, or a plain model.

Its options are fields of :class:`MuToRTrainingArguments` (``grad_clip``, ``task_eval_steps``) beside Trainer's
own; the task's evaluator, a function, is a constructor argument like Trainer's ``compute_metrics``. What it
changes, through Trainer's public hooks:

* ``get_batch_samples`` / ``training_step``: for an auxiliary objective (registers or heads) the auxiliary
  targets of *all* micro-batches of an optimizer step are counted before the first forward, as Trainer counts
  label tokens for ``num_items_in_batch``, and each micro-batch carries the count (``num_registers_in_batch``)
  into its forward. MuToR samples its offsets as it counts, so the counting happens at the step's first
  ``training_step``, after Trainer has restored the RNG states of a resumed run (it does so after fetching the
  step's batches): the step's micro-batches reach it inside the first one, and the trainer keeps nothing between
  the two hooks. Both losses are token-weighted means over the whole accumulated (and, with
  ``average_tokens_across_devices``, distributed) batch, so gradient accumulation gives the update of one batch.
* ``compute_loss`` / ``log``: the forward's loss sums are added up per logging window, and each training log
  gets the window's token-weighted ``ntp_loss``, ``reg_loss``, accuracies, per-offset values and what clipping
  did (``grad_clipped``, ``reg_grad_norm``, ``reg_grad_clipped``); for a plain model the loss is Trainer's own.
* ``evaluation_loop``: ``eval_ntp_loss`` and ``eval_reg_loss`` are sums over the whole evaluation set divided by
  its supervised tokens and its registers, and ``eval_loss`` is ``(1-a) * eval_ntp_loss + a * eval_reg_loss``
  (``eval_ntp_loss`` for next-token and a plain model), where Trainer would average per-batch means.
* callbacks: the task evaluator at step 0, every ``task_eval_steps`` and at the end; a log at the last step (so
  a run shorter than ``logging_steps`` still has a training loss); and in every checkpoint the running sum of the
  per-step training losses (``mutor_train_loss.json``), so :meth:`MuToRTrainer.whole_run_train_loss` is the
  mean over the whole run also after a resume.

Where transformers has no public hook, a private one is overridden or read, each with a comment saying why;
:data:`PRIVATE_TRAINER_NAMES` lists them and a test checks that the installed transformers still has each:

* ``_clip_grad_norm`` / ``_get_grad_norm``: by default (``grad_clip="separate"``) the model's parameters and the
  wrapper's own (register vector, Multi-Token heads) are clipped against ``max_grad_norm`` each on its own, so the
  model gets exactly the update clipping would give it without mutor (:mod:`mutor.integrations.clipping`).
* ``_save`` / ``_load_from_checkpoint`` / ``_load_best_model``: a checkpoint is the base model saved exactly as
  transformers (or peft) saves it, plus the wrapper's sidecar files, and resuming loads both. Under FSDP /
  DeepSpeed ZeRO-3 both parts are written from the state dict Trainer gathers, and an FSDP resume loads the whole
  wrapper from FSDP's own file. Trainer then restores optimizer, scheduler, RNG states and data position as
  usual, so a resumed run continues exactly.
* ``_total_loss_scalar`` / ``_tr_loss``: the run's loss sum so far, for the checkpoints.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from transformers import Trainer

from ..core.layout import IGNORE_INDEX
from ..methods.base import TrainingWrapper
from ..methods.checkpoint import save_wrapper_into
from .callbacks import TRAIN_LOSS_FILE, LogLastStep, LossSumInCheckpoint, TaskEvalCallback
from .clipping import check_grad_clip, clip_group
from .training_args import MuToRArguments, MuToRTrainingArguments, mutor_option

__all__ = ["MuToRTrainer", "MuToRArguments", "MuToRTrainingArguments", "PRIVATE_TRAINER_NAMES"]

REGISTERS_IN_BATCH = "num_registers_in_batch"   # the accumulated batch's register count, in each micro-batch
STEP_BATCHES = "mutor_step_batches"             # in a step's first micro-batch: all of the step's micro-batches

# what MuToRTrainer overrides or reads of Trainer where transformers has no public hook (see the module docstring)
PRIVATE_TRAINER_NAMES = ("_clip_grad_norm", "_get_grad_norm", "_save", "_load_from_checkpoint", "_load_best_model",
                         "_total_loss_scalar", "_tr_loss")


class MuToRTrainer(Trainer):
    """``transformers.Trainer`` for :class:`~mutor.MuToRModel`, the Multi-Token baseline, or any plain causal LM.

    Both losses are token-weighted means over the whole accumulated (and distributed) batch, so gradient
    accumulation gives the update of one large batch; the logs add the next-token, register and per-offset
    losses and accuracies; checkpoints are the base model as transformers saves it plus the wrapper's
    sidecar, and a resumed run continues exactly.

    Args:
        *args: ``transformers.Trainer``'s positional arguments (``model``, ``args``, ...). ``args`` is a
            :class:`MuToRTrainingArguments` (``grad_clip``, ``task_eval_steps``), or a plain
            ``TrainingArguments`` for mutor's defaults.
        task_evaluator: ``task_evaluator(model, step) -> dict`` of held-out metrics computed with the plain base
            model at step 0, every ``task_eval_steps`` and at the end; logged with an ``eval_`` prefix. None: none.
        **kwargs: ``transformers.Trainer``'s keyword arguments.

    Raises:
        TypeError: ``grad_clip`` given here (it is a field of :class:`MuToRTrainingArguments`).
        ValueError: When :meth:`train` starts, ``grad_clip="separate"`` under a backend that cannot run it
            (FSDP1, DeepSpeed).
    """

    def __init__(self, *args: Any, task_evaluator: Optional[Callable[[Any, int], dict]] = None, **kwargs: Any):
        if "grad_clip" in kwargs:
            raise TypeError("MuToRTrainer: grad_clip is a field of the training arguments, not of the trainer: "
                            "args=MuToRTrainingArguments(..., grad_clip=...)")
        super().__init__(*args, **kwargs)
        self.task_evaluator = task_evaluator
        # the forward's loss sums: the logging window's ("train"), the running evaluation's ("eval")
        self._sums: dict[str, dict] = {"train": defaultdict(float), "eval": defaultdict(float)}
        if task_evaluator is not None:
            self.add_callback(TaskEvalCallback(self))
        self.add_callback(LogLastStep())
        self.add_callback(LossSumInCheckpoint(self))

    # ----------------------------------------------------------------- helpers
    @property
    def grad_clip(self) -> str:
        """How clipping treats the wrapper's own parameters: ``args.grad_clip`` (``"separate"`` or ``"joint"``)."""
        return mutor_option(self.args, "grad_clip")

    def training_wrapper(self) -> Optional[TrainingWrapper]:
        """The wrapper being trained (MuToR, Multi-Token, next-token), or None for a plain model."""
        m = self.accelerator.unwrap_model(self.model)
        return m if isinstance(m, TrainingWrapper) else None

    def plain_model(self) -> torch.nn.Module:
        """The base model (what is saved and what generates), without any wrapper."""
        w = self.training_wrapper()
        return w.base_model if w is not None else self.accelerator.unwrap_model(self.model)

    @torch.no_grad()
    def run_task_evaluator(self, step: int) -> dict:
        """The task evaluator's metrics for the plain model, in training's precision ({} without an evaluator)."""
        if self.task_evaluator is None:
            return {}
        model = self.plain_model()
        was = model.training
        model.eval()
        try:
            # in training's precision whatever the method: accelerate autocasts the forward of the model it was
            # given, which is the plain model itself for a plain next-token run but a wrapper around it otherwise
            with self.accelerator.autocast():
                return dict(self.task_evaluator(model, step))
        finally:
            model.train(was)

    def floating_point_ops(self, inputs: dict) -> int:
        """``total_flos``: the wrapper's estimate, registers and heads included (Trainer would report 0: a wrapper
        is not a PreTrainedModel)."""
        w = self.training_wrapper()
        return super().floating_point_ops(inputs) if w is None else w.floating_point_ops(inputs)

    # ------------------------------------------------------------- evaluation
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix: str = "eval"):
        """Trainer's evaluation, its losses weighted as training weights them, with the same offsets at every call.

        ``eval_ntp_loss`` is the next-token loss summed over every supervised token of the evaluation set and divided
        by their number; ``eval_reg_loss`` the same over every register (or Multi-Token head target); ``eval_loss``
        is ``(1 - a) * eval_ntp_loss + a * eval_reg_loss`` with the method's loss weight ``a`` (0 for next-token
        and a plain model, whose ``eval_loss`` is then ``eval_ntp_loss``). Trainer alone would average each
        batch's mean loss over the batches, which weights a token of a short batch more than one of a long batch.
        MuToR draws its offsets from a generator seeded with ``args.seed`` (the global RNG forked, a private
        generator saved and restored), so the same weights give the same ``eval_loss`` and evaluating does not
        move the training RNG."""
        w = self.training_wrapper()
        args = (dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        self._sums["eval"] = defaultdict(float)
        if w is None:
            output = super().evaluation_loop(*args)
            return self._token_weighted_eval_losses(output, self._sums["eval"], 0.0, metric_key_prefix)
        private = w.rng_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.args.seed)
            if private is not None:
                w.set_rng_state(torch.Generator().manual_seed(self.args.seed).get_state())
            try:
                output = super().evaluation_loop(*args)
            finally:
                if private is not None:
                    w.set_rng_state(private)
        return self._token_weighted_eval_losses(output, self._sums["eval"], w.loss_weight, metric_key_prefix)

    def _token_weighted_eval_losses(self, output, s: dict, a: float, metric_key_prefix: str):
        """``output`` with ``{prefix}_ntp_loss``, ``{prefix}_reg_loss`` and ``{prefix}_loss`` from the evaluation's
        sums ``s`` (every process's share added up), each divided as :func:`~mutor.methods.objective.objective_output`
        divides a training batch's: by the supervised tokens, and by the registers (a register term of 0 when the
        set has none). Without any supervised token, Trainer's own ``eval_loss`` is left as it is."""
        sums = torch.tensor([s["ntp_sum"], s["ntp_n"], s["reg_sum"], s["reg_n"]], dtype=torch.float64,
                            device=self.args.device)
        if self.args.world_size > 1:
            sums = self.accelerator.gather(sums[None]).sum(0)                  # every rank's share of the set
        ntp_sum, ntp_n, reg_sum, reg_n = sums.tolist()
        if not ntp_n:
            return output
        ntp = ntp_sum / ntp_n
        reg = reg_sum / reg_n if reg_n else 0.0
        output.metrics[f"{metric_key_prefix}_ntp_loss"] = ntp
        if reg_n:
            output.metrics[f"{metric_key_prefix}_reg_loss"] = reg
        output.metrics[f"{metric_key_prefix}_loss"] = ntp if a == 0 else (1.0 - a) * ntp + a * reg
        return output

    # --------------------------------------------------------------- clipping
    def _split_groups(self) -> Optional[tuple[list, list]]:
        """(model parameters, the wrapper's own) when the wrapper has parameters of its own whose gradients can
        be told apart from the model's (not under FSDP1 or DeepSpeed); else None (Trainer's own norm)."""
        w = self.training_wrapper()
        if w is None or self.is_deepspeed_enabled or (self.is_fsdp_enabled and not self.accelerator.is_fsdp2):
            return None
        groups = w.parameter_groups()
        return groups if groups[1] else None

    def train(self, *args: Any, **kwargs: Any):
        """``Trainer.train``, after checking that this backend can run ``grad_clip``."""
        w = self.training_wrapper()
        if w is not None and w.parameter_groups()[1] and self.args.max_grad_norm and self.args.max_grad_norm > 0:
            check_grad_clip(self.grad_clip, fsdp1=self.is_fsdp_enabled and not self.accelerator.is_fsdp2,
                            deepspeed=self.is_deepspeed_enabled)
        return super().train(*args, **kwargs)

    def _clip_grad_norm(self, model):
        # private: Trainer clips here, between the last backward and the optimizer step, and no public hook runs
        # before it (on_pre_optimizer_step comes after)
        groups = self._split_groups()
        if groups is None:
            norm = super()._clip_grad_norm(model)
            self._record_clip(norm, None)
            return norm
        return self._clip_groups(groups, self.args.max_grad_norm)

    def _get_grad_norm(self, model, grad_norm=None):
        # private: the norm Trainer logs as grad_norm comes from here, also when it does not clip (max_grad_norm 0)
        if grad_norm is None and (groups := self._split_groups()) is not None:     # max_grad_norm 0: norms only
            grad_norm = self._clip_groups(groups, float("inf"))
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def _clip_groups(self, groups: tuple[list, list], max_norm: float) -> torch.Tensor:
        """Clip as ``grad_clip`` says; returns what Trainer logs as ``grad_norm``: the model's own norm
        (``separate``) or the joint norm (``joint``), before clipping."""
        model_params, own = groups
        self.accelerator.unscale_gradients()                     # fp16 loss scaling: once, before any norm
        if self.grad_clip == "joint":
            reg = clip_group(own, float("inf"))
            norm = clip_group(model_params + own, max_norm)
        else:
            norm = clip_group(model_params, max_norm)
            reg = clip_group(own, max_norm)
        self._record_clip(norm, reg, max_norm)
        return norm

    def _record_clip(self, norm, reg, max_norm: Optional[float] = None) -> None:
        """Count, for the logging window, the steps whose update clipping scaled (model, and wrapper's own)."""
        if norm is None:
            return
        max_norm = self.args.max_grad_norm if max_norm is None else max_norm
        c = self._sums["train"]
        c["clip_steps"] += 1
        c["clipped"] += float(float(norm) > max_norm)
        if reg is not None:
            c["reg_norm"] = float(reg)
            c["reg_steps"] += 1
            c["reg_clipped"] += float(float(reg) > max_norm and self.grad_clip == "separate")

    # --------------------------------------------------------------- the loss
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """Trainer's micro-batches of one optimizer step; under a training wrapper the first carries them all."""
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batch_samples and self.training_wrapper() is not None:
            # counted at the step's first training_step, not here: on resume, Trainer restores the RNG states
            # only after fetching the first step's batches, and MuToR draws its offsets as it counts
            batch_samples[0][STEP_BATCHES] = list(batch_samples)
        return batch_samples, num_items_in_batch

    def training_step(self, model, inputs, num_items_in_batch=None):
        """Trainer's training step; on a step's first micro-batch, :meth:`count_registers` runs first."""
        if STEP_BATCHES in inputs:
            self.count_registers(inputs[STEP_BATCHES])
        return super().training_step(model, inputs, num_items_in_batch)

    def count_registers(self, batch_samples: list[dict]) -> torch.Tensor:
        """Count the auxiliary targets of every micro-batch of one optimizer step (MuToR samples its offsets).

        Args:
            batch_samples: The step's micro-batches (:meth:`get_batch_samples`); each gets the count under
                ``num_registers_in_batch``, the denominator of its register loss.

        Returns:
            The count, over every process with ``average_tokens_across_devices``.
        """
        w = self.training_wrapper()
        for b in batch_samples:
            b.pop(STEP_BATCHES, None)
        counts = [w.count_reg_targets(b) for b in batch_samples]
        for b, c in zip(batch_samples, counts):
            b.update(c.forward_inputs)           # the offsets and layout counted: the forward trains on them
        n = torch.tensor(sum(c.count for c in counts), device=self.args.device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            n = self.accelerator.gather(n).sum()
        for b in batch_samples:
            b[REGISTERS_IN_BATCH] = n
        return n

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Trainer's loss, with MuToR's loss sums and counts accumulated for the logs and evaluation."""
        mode = "train" if model.training else "eval"
        if self.training_wrapper() is None:
            targets = self._next_token_targets(inputs) if mode == "eval" else None   # before label smoothing pops
            # evaluating, each batch's own mean (not scaled to a count over processes): times its count, a sum
            out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                       num_items_in_batch=None if mode == "eval" else num_items_in_batch)
            if targets:
                loss = out[0] if return_outputs else out
                self._sums["eval"]["ntp_sum"] += float(loss.detach().double().mean()) * targets
                self._sums["eval"]["ntp_n"] += targets
            return out
        if not (model.training and num_items_in_batch is not None):     # a per-batch mean: the batch's own count
            inputs = {k: v for k, v in inputs.items() if k != REGISTERS_IN_BATCH}
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        self._accumulate(outputs, self._sums[mode])
        return (loss, outputs) if return_outputs else loss

    def _next_token_targets(self, inputs: dict) -> float:
        """A plain model's batch: its next-token targets, counted as Trainer counts them for ``num_items_in_batch``
        (0 without labels). Its mean loss times this count is the batch's share of the evaluation's sum."""
        labels = inputs.get("shift_labels")
        if labels is None:
            labels = inputs.get("labels")
            if labels is None:
                return 0.0
            labels = labels[..., 1:]                                    # the model shifts them
        return float(labels.ne(IGNORE_INDEX).sum())

    @torch.no_grad()
    def _accumulate(self, out, s: dict) -> None:
        """Add the forward's loss sums and counts to ``s`` (the logging window's, or an evaluation's), so the
        reported values are token-weighted means."""
        s["ntp_sum"] += float(out.ntp_loss_sum)
        s["ntp_n"] += float(out.num_ntp_tokens or 0)
        if out.num_registers:
            s["reg_sum"] += float(out.reg_loss_sum)
            s["reg_n"] += float(out.num_registers)
            s["acc_sum"] += float(out.reg_hits_per_offset.sum())
        if out.reg_count_per_offset is not None:
            s["k_n"] = s["k_n"] + out.reg_count_per_offset.float().cpu()
            s["k_loss"] = s["k_loss"] + out.reg_loss_sum_per_offset.float().cpu()
            s["k_acc"] = s["k_acc"] + out.reg_hits_per_offset.float().cpu()

    def log(self, logs: dict, start_time: Optional[float] = None) -> None:
        """Trainer's log, with a training log's window of MuToR means added (and the window restarted)."""
        if "loss" in logs:                       # a training log: the window's means, and a new window
            logs.update(self._window_logs(self._sums["train"]))
            self._sums["train"] = defaultdict(float)
        super().log(logs, start_time)

    def _window_logs(self, s: dict) -> dict:
        """The logging window's token-weighted means and clipping shares (rounded to 6 decimals)."""
        logs = {}
        if s.get("ntp_n"):
            logs["ntp_loss"] = round(s["ntp_sum"] / s["ntp_n"], 6)
            if s.get("reg_n"):
                logs["reg_loss"] = round(s["reg_sum"] / s["reg_n"], 6)
                logs["reg_accuracy"] = round(s["acc_sum"] / s["reg_n"], 6)
            if isinstance(s.get("k_n"), torch.Tensor):
                names = self.training_wrapper().offset_names()
                for name, n, l, a in zip(names, s["k_n"].tolist(), s["k_loss"].tolist(), s["k_acc"].tolist()):
                    if n:
                        logs[f"reg_loss/{name}"] = round(l / n, 6)
                        logs[f"reg_accuracy/{name}"] = round(a / n, 6)
        if s.get("clip_steps"):
            logs["grad_clipped"] = round(s["clipped"] / s["clip_steps"], 6)
            if s.get("reg_steps"):
                logs["reg_grad_norm"] = round(s["reg_norm"], 6)
                if self.grad_clip == "separate":
                    logs["reg_grad_clipped"] = round(s["reg_clipped"] / s["reg_steps"], 6)
        return logs

    # ------------------------------------------------------------ checkpoints
    def whole_run_train_loss(self, resumed_from: Optional[str] = None) -> float:
        """Mean training loss per optimizer step over the whole run, after :meth:`train`.

        Not resumed: Trainer's own ``train_loss``. Resumed from a checkpoint: the loss sum stored in
        it (or, for a checkpoint without one, the losses logged up to it in its ``trainer_state.json``)
        plus the sum since the resume, over all the steps they cover.

        Args:
            resumed_from: The checkpoint directory training resumed from; None: not resumed.

        Returns:
            The mean loss per step.
        """
        train_loss = next(h["train_loss"] for h in reversed(self.state.log_history) if "train_loss" in h)
        state = Path(resumed_from) / "trainer_state.json" if resumed_from else None
        history = json.loads(state.read_text()) if state is not None and state.is_file() else {}
        start = history.get("global_step", 0)          # where the resumed train() started
        if not start:
            return train_loss
        done = self.state.global_step - start
        since = train_loss * max(done, 0.001)          # Trainer's train_loss is this sum over max(done, 0.001)
        stored = Path(resumed_from) / TRAIN_LOSS_FILE
        if stored.is_file() and json.loads(stored.read_text()).get("global_step") == start:
            before, steps_before = float(json.loads(stored.read_text())["loss_sum"]), start
        else:                                # the logged window means, weighted by their lengths
            before, steps_before, prev = 0.0, 0, 0
            for h in history.get("log_history", []):
                if "loss" in h and "step" in h and prev < h["step"] <= start:
                    before += float(h["loss"]) * (h["step"] - prev)
                    steps_before, prev = h["step"], h["step"]
        return (before + since) / max(steps_before + done, 0.001)

    def _save(self, output_dir: Optional[str] = None, state_dict: Optional[dict] = None) -> None:
        # private: save_model hands the state dict it gathers under FSDP / DeepSpeed ZeRO-3 only to _save
        w = self.training_wrapper()
        if w is None:
            return super()._save(output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        if state_dict is not None and not state_dict:
            raise ValueError("DeepSpeed ZeRO-3 did not gather the model's weights, so neither the base model nor "
                             "the wrapper's own parameters can be saved: set zero3_save_16bit_model: true in the "
                             "accelerate config (stage3_gather_16bit_weights_on_model_save in DeepSpeed's own)")
        # under FSDP / DeepSpeed, Trainer gathers the wrapper's full state dict; the live parameters are shards
        save_wrapper_into(w, output_dir, state_dict=state_dict)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Optional[torch.nn.Module] = None) -> None:
        # private: Trainer loads a checkpoint's weights here (resuming, and the best model), with no public hook
        target = self.accelerator.unwrap_model(model if model is not None else self.model)
        if not isinstance(target, TrainingWrapper):
            return super()._load_from_checkpoint(resume_from_checkpoint, model=model)
        if self.is_fsdp_enabled:
            # FSDP's own resume file (pytorch_model_fsdp.bin, or its sharded folder) holds the whole wrapper,
            # registers / heads included, and loads into the sharded parameters; the sidecar adds the generator
            super()._load_from_checkpoint(resume_from_checkpoint, model=model)
            target.load_sidecar(resume_from_checkpoint, parameters=False)
            return
        # the checkpoint's weights are the base model's: Trainer loads them into self.model and judges the loaded
        # keys by its attributes (lm_head.weight missing where embeddings are tied, say)
        wrapper, self.model = self.model, target.base_model
        try:
            super()._load_from_checkpoint(resume_from_checkpoint)
        finally:
            self.model = wrapper
        target.load_sidecar(resume_from_checkpoint)

    def _load_best_model(self) -> None:
        # private: Trainer loads the best checkpoint at the end of training here, with no public hook
        if self.training_wrapper() is None:
            return super()._load_best_model()
        if self.state.best_model_checkpoint:
            self._load_from_checkpoint(self.state.best_model_checkpoint)
