"""MuToRSFTTrainer: MuToR (or the Multi-Token baseline) inside TRL's ``SFTTrainer``.

An SFTTrainer script changes in two lines: import ``MuToRSFTTrainer`` from here and pass
``mutor_config=MuToRConfig(...)``. Everything SFTTrainer does before training is left to it:
it builds the model from an id (``model_init_kwargs``), applies ``peft_config``, tokenizes
prompt-completion, conversational and plain-text datasets, turns ``completion_only_loss`` /
``assistant_only_loss`` into ``labels`` (-100 outside the completion / assistant turns), packs
and picks the collator. Registers are then placed from those labels and, for packed or
padding-free batches, from the per-document ``position_ids`` (mutor's layout: no register
sits in a prompt or outside an assistant turn, none crosses a document).

What is unusual:

* The wrapper (:class:`~mutor.MuToRModel` or :class:`~mutor.methods.multi_token.MultiTokenModel`) is
  put around the model only *after* ``SFTTrainer.__init__`` has finished, so SFTTrainer sees a
  plain transformers (or peft) model exactly as it would without mutor, including the fused
  LM head it patches onto the model's forward (a ``fused_lm_head=False`` call, which is what
  the wrapper makes, is the model's original forward). The register vector is initialised in
  a forked RNG, so the run sees the same data order as plain SFTTrainer with the same seed.
* The class order is ``MuToRSFTTrainer -> MuToRTrainer -> _WrapperLoss -> SFTTrainer ->
  Trainer``: MuToRTrainer's overrides apply unchanged (offsets sampled once per optimizer step,
  the register count of the whole accumulated batch as the register-loss denominator,
  ntp/register/per-offset logs, checkpoints = vanilla model + sidecar, exact resume).
* SFTTrainer's ``compute_loss`` calls the model with ``fused_lm_head=True`` and reads per-token
  log-probabilities of the *next-token* head, which a MuToR forward (regular rows plus register
  rows) cannot provide. With a wrapper the loss is therefore the wrapper's own
  (``Trainer.compute_loss``, as in MuToRTrainer), and SFTTrainer's metrics are recomputed from
  the wrapper's output on the regular tokens only: ``entropy`` and ``mean_token_accuracy`` from
  the regular-token logits (MuToRModel without ``loss_chunk_size``; other wrappers return no
  logits and these two are not logged), ``num_tokens`` as SFTTrainer counts it.
* SFTTrainer features that change the next-token loss itself (``loss_type="dft"``,
  ``compute_loss_func``, label smoothing, the MoE router loss) have no MuToR counterpart and are
  refused by name.
* mutor's training options (``grad_clip``, ``task_eval_steps``) are fields of :class:`MuToRSFTConfig`, which is
  ``SFTConfig`` with them added; a plain ``SFTConfig`` gives their defaults.

SFTTrainer keeps its metrics in names of its own (``_metrics``, ``_total_train_tokens``, ``_tp_size``) and the
loss's inputs go through Trainer's ``_prepare_inputs``: no public hook reaches them, so they are used as
SFTTrainer uses them, listed in :data:`PRIVATE_SFT_TRAINER_NAMES` for a test to check against the installed TRL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import nn
from transformers import Trainer

try:
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.utils import entropy_from_logits
except ImportError as e:     # pragma: no cover - exercised only without the extra
    raise ImportError("mutor.integrations.trl needs TRL: pip install -e '.[trl]' in the mutor checkout "
                      "(trl>=1.16)") from e

from ..methods.base import TrainingWrapper
from ..methods.multi_token import MultiTokenConfig
from ..methods.mutor import MuToRConfig
from ..methods.registry import method_of_config
from .trainer import MuToRTrainer
from .training_args import MuToRArguments

__all__ = ["MuToRSFTTrainer", "MuToRSFTConfig", "MuToRConfig", "MultiTokenConfig"]   # one import line for a script

logger = logging.getLogger(__name__)

# what SFTTrainer's padding-free collator adds for varlen (flash) kernels; mutor builds its own mask from
# position_ids, and a wrapper forwards unknown keys to the base model, which must not see them
_VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "use_cache")

# what MuToRSFTTrainer reads of SFTTrainer / Trainer where they have no public hook (see the module docstring)
PRIVATE_SFT_TRAINER_NAMES = ("_metrics", "_total_train_tokens", "_tp_size", "_prepare_inputs")


@dataclass
class MuToRSFTConfig(MuToRArguments, SFTConfig):
    """``trl.SFTConfig`` with mutor's training options (:class:`~mutor.integrations.training_args.MuToRArguments`:
    ``grad_clip``, ``task_eval_steps``), for :class:`MuToRSFTTrainer`."""


class _WrapperLoss:
    """``compute_loss`` / ``prediction_step`` for a wrapper; SFTTrainer's own for a plain model.

    Sits between MuToRTrainer and SFTTrainer in the class order: MuToRTrainer.compute_loss adds the
    register count and keeps the logged sums around this call.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.training_wrapper() is None:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        inputs = {k: v for k, v in inputs.items() if k not in _VARLEN_KEYS}
        w = self.training_wrapper()
        if w.returns_logits and w.loss_chunk_size is None:
            inputs["return_logits"] = True          # regular-token logits for entropy / token accuracy
        loss, outputs = Trainer.compute_loss(self, model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        self._record_sft_metrics(inputs, outputs)
        return (loss, outputs) if return_outputs else loss

    @torch.no_grad()
    def _record_sft_metrics(self, inputs: dict, out) -> None:
        """SFTTrainer's metrics (entropy, mean_token_accuracy, num_tokens) on the regular tokens only."""
        mode = "train" if self.model.training else "eval"
        # private: SFTTrainer's metric store and token count, which its own compute_loss fills
        metrics, gather = self._metrics[mode], self.accelerator.gather_for_metrics
        if out.logits is not None and out.layout is not None:
            _, targets, is_reg = out.layout.loss_rows()                                  # rows of out.logits
            logits = out.logits[~is_reg]                                                 # (n_ntp, V)
            tgt = targets[~is_reg]                                                       # (n_ntp,)
            n = gather(torch.tensor(len(tgt), device=logits.device)).sum()
            ent = gather(entropy_from_logits(logits.float()).sum()).sum()
            hit = gather((logits.argmax(-1) == tgt).sum()).sum()
            metrics["entropy"].append((ent / n).item() if n > 0 else 0.0)
            metrics["mean_token_accuracy"].append((hit / n).item() if n > 0 else 0.0)
        if mode == "train":      # SFTTrainer's count: every token of the batch, padding excluded
            ids = inputs["input_ids"]
            local = inputs["attention_mask"].sum() if "attention_mask" in inputs else \
                torch.tensor(ids.numel(), device=ids.device)
            self._total_train_tokens += int(gather(local).sum()) // self._tp_size
        # ntp_loss / reg_loss: MuToRTrainer's token-weighted sums, in training logs and evaluation metrics alike
        metrics["num_tokens"] = [self._total_train_tokens]

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation: the wrapper's loss; logits for ``compute_metrics`` come from the plain model, as
        SFTTrainer recomputes them with an extra forward."""
        if self.training_wrapper() is None:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        inputs = self._prepare_inputs(inputs)          # private: as Trainer's and SFTTrainer's prediction_step
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs).detach()
            if prediction_loss_only:
                return loss, None, None
            plain = {k: inputs[k] for k in ("input_ids", "attention_mask", "position_ids") if k in inputs}
            logits = self.plain_model()(**plain, use_cache=False).logits                # (B, T, V)
        return loss, logits, inputs.get("labels")


class MuToRSFTTrainer(MuToRTrainer, _WrapperLoss, SFTTrainer):
    """``trl.SFTTrainer`` that trains MuToR (or the Multi-Token baseline).

    SFTTrainer builds, adapts (peft), tokenizes and collates as it always does; the wrapper is put around its
    model afterwards, and the loss is the wrapper's. Training, logs, checkpoints and resuming are
    :class:`~mutor.MuToRTrainer`'s.

    Args:
        model: A model id or a model, as ``SFTTrainer`` takes it; or an already built ``MuToRModel`` /
            ``MultiTokenModel`` (e.g. with ``loss_chunk_size``), whose base model SFTTrainer then works on.
        args: A :class:`MuToRSFTConfig` (``grad_clip``, ``task_eval_steps``), or a plain ``SFTConfig`` for
            mutor's defaults. Options that replace the next-token loss (``loss_type`` other than ``"nll"``,
            label smoothing, the MoE router loss) are refused.
        *positional: ``SFTTrainer``'s further positional arguments.
        mutor_config: A :class:`~mutor.MuToRConfig` (MuToR) or a :class:`~mutor.MultiTokenConfig` (the
            Multi-Token baseline); None when ``model`` is already a wrapper.
        **kwargs: ``SFTTrainer``'s keyword arguments, and :class:`~mutor.MuToRTrainer`'s ``task_evaluator``.
            ``compute_loss_func`` is refused.

    Raises:
        TypeError: ``mutor_config`` is not a method's config (and ``model`` is not a wrapper).
        ValueError: Both a wrapper and ``mutor_config``, or an SFTTrainer option that replaces the next-token loss.
    """

    def __init__(self, model: Union[str, nn.Module], args: Optional[SFTConfig] = None, *positional: Any,
                 mutor_config: Optional[Union[MuToRConfig, MultiTokenConfig]] = None, **kwargs: Any):
        wrapper = model if isinstance(model, TrainingWrapper) else None
        if wrapper is not None and mutor_config is not None:
            raise ValueError("MuToRSFTTrainer: pass either a MuToRModel/MultiTokenModel as `model` or `mutor_config`, "
                             "not both (the wrapper already carries its config)")
        if wrapper is None:
            try:
                method = method_of_config(mutor_config)
            except TypeError:
                raise TypeError("MuToRSFTTrainer needs mutor_config=MuToRConfig(...) (or MultiTokenConfig(...) for the "
                                f"Multi-Token baseline), got {type(mutor_config).__name__}; for plain SFT use "
                                "trl.SFTTrainer") from None
        _refuse_next_token_only_options(args, kwargs.get("compute_loss_func"))
        super().__init__(wrapper.base_model if wrapper is not None else model, args, *positional, **kwargs)
        if self.aux_loss_enabled:
            raise ValueError("MuToRSFTTrainer: the MoE router auxiliary loss (router_aux_loss_coef) is not part of "
                             "the MuToR objective; set router_aux_loss_coef=0.0")
        if self.args.packing and self.args.packing_strategy == "wrapped":
            logger.warning("packing_strategy='wrapped' gives no document boundaries (TRL's own behaviour): "
                           "attention and register targets then run across documents; use 'bfd' to keep them apart")
        base = self.model                      # built, peft-wrapped and fused-head-patched by SFTTrainer
        if wrapper is None:
            # Trainer seeded the global RNG in __init__ and draws the data order from it later: the register
            # init must not consume it, or the run would see other batches than plain SFTTrainer with this seed
            with torch.random.fork_rng(devices=[]):
                wrapper = method.wrapper_class(base, mutor_config)
        else:
            wrapper.base_model = base           # the same model, now possibly under SFTTrainer's peft adapter
        self.model = self.model_wrapped = wrapper
        self.callback_handler.model = wrapper
        self.model_accepts_loss_kwargs = True  # the wrappers normalise by num_items_in_batch themselves


def _refuse_next_token_only_options(args, compute_loss_func) -> None:
    """SFTTrainer options that replace the next-token loss; MuToR's loss is the wrapper's own."""
    if compute_loss_func is not None:
        raise ValueError("MuToRSFTTrainer: compute_loss_func is not supported (the loss is (1-a)*L_ntp + a*L_reg, "
                         "computed by the MuToR wrapper)")
    if args is None:
        return
    if getattr(args, "loss_type", "nll") != "nll":
        raise ValueError(f"MuToRSFTTrainer: loss_type={args.loss_type!r} is not supported; MuToR trains with "
                         "loss_type='nll'")
    if getattr(args, "label_smoothing_factor", 0.0):
        raise ValueError("MuToRSFTTrainer: label_smoothing_factor must be 0 (MuToR's losses are plain "
                         "cross-entropies)")
