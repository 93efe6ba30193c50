"""One base for the training-time wrappers: MuToR, the Multi-Token baseline and the next-token baseline.

A wrapper holds an unmodified transformers causal LM (or a peft model around one) as ``base_model``
and adds a training objective on top; at inference, and in every checkpoint, the base model is all
there is. What the three share lives here once:

* the checks on the base model (a transformers causal LM of a family mutor handles exactly, and a
  ``loss_chunk_size`` its output layer allows) and the pass-throughs that Trainer and generation use;
* the objective: a forward computes per-row cross-entropies and hands them to :func:`objective_output`,
  which resolves the two denominators and divides, once, for the loss and for every reported mean;
  the output also carries the sums, which the trainer adds up across micro-batches and logging windows;
* checkpoints: ``save_pretrained`` writes the base model exactly as transformers / peft would plus a
  sidecar (``config_file``, and ``weights_file`` for a wrapper with parameters of its own), atomically;
  ``load_sidecar`` and ``from_pretrained`` read it back;
* what the trainer asks of any wrapper: :meth:`count_reg_targets` (for the accumulated-batch
  denominator; what it builds to count, it leaves in the batch under ``COUNTED_LAYOUT`` for the forward,
  so a micro-batch's layout is built once), :meth:`offset_names` (per-offset logs) and the offset
  generator's state.

The auxiliary objective is called ``reg`` everywhere (the paper's L_reg); for the Multi-Token baseline
the "registers" are its extra heads' targets, reported under the same names so the methods compare.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn
from transformers.utils import ModelOutput

from ..core.masks import attention_windows
from ..core.support import check_supported
from ..utils.io import replace_directory

__all__ = ["COUNTED_LAYOUT", "MuToROutput", "TrainingWrapper", "inner_model", "labels_of", "master_dtype", "objective_output",
           "row_weights"]


COUNTED_LAYOUT = "counted_layout"   # batch key: the layout count_reg_targets built, handed to the forward


@dataclass
class MuToROutput(ModelOutput):
    """What every wrapper's forward returns (MuToR, the Multi-Token baseline, the next-token baseline).

    For the Multi-Token baseline the "registers" are its extra heads' targets, reported under the same names.
    Per-offset tensors follow the wrapper's :meth:`~TrainingWrapper.offset_names`; an offset with no register
    in the batch (``reg_count_per_offset`` 0) has NaN loss and accuracy, not 0.

    Attributes:
        loss: ``(1 - a) * ntp_loss + a * reg_loss``, the loss to backpropagate.
        ntp_loss: Mean next-token cross-entropy.
        reg_loss: Mean register cross-entropy.
        reg_accuracy: Share of registers whose top-1 prediction is their target.
        reg_loss_per_offset: (K,) mean register cross-entropy per offset.
        reg_accuracy_per_offset: (K,) register top-1 accuracy per offset.
        reg_count_per_offset: (K,) registers per offset in this batch.
        num_registers: Registers in this batch.
        num_ntp_tokens: Next-token targets in this batch.
        logits: With ``return_logits=True`` (MuToR without ``loss_chunk_size``): (N, V) logits of the loss rows,
            in the order of ``layout.loss_rows()``.
        layout: With ``return_logits=True``: the batch's :class:`~mutor.RegisterLayout`.
        ntp_loss_sum: Sum that ``ntp_loss`` divides (detached); the trainer accumulates it.
        reg_loss_sum: Sum that ``reg_loss`` divides (detached).
        reg_loss_sum_per_offset: (K,) sums that ``reg_loss_per_offset`` divides.
        reg_hits_per_offset: (K,) top-1 hits per offset.
    """

    loss: Optional[torch.Tensor] = None
    ntp_loss: Optional[torch.Tensor] = None
    reg_loss: Optional[torch.Tensor] = None
    reg_accuracy: Optional[torch.Tensor] = None
    reg_loss_per_offset: Optional[torch.Tensor] = None
    reg_accuracy_per_offset: Optional[torch.Tensor] = None
    reg_count_per_offset: Optional[torch.Tensor] = None
    num_registers: Optional[int] = None
    num_ntp_tokens: Optional[int] = None
    logits: Optional[torch.Tensor] = None
    layout: Optional[Any] = None
    ntp_loss_sum: Optional[torch.Tensor] = None
    reg_loss_sum: Optional[torch.Tensor] = None
    reg_loss_sum_per_offset: Optional[torch.Tensor] = None
    reg_hits_per_offset: Optional[torch.Tensor] = None


# ------------------------------------------------------------------ the objective
def _denominators(n_ntp: int, n_reg: int, num_items_in_batch, num_registers_in_batch):
    """The loss denominators: the accumulated batch's counts when the trainer gives them, else this batch's."""
    ntp_den = num_items_in_batch if num_items_in_batch is not None else max(n_ntp, 1)
    reg_den = num_registers_in_batch if num_registers_in_batch is not None else max(n_reg, 1)
    return ntp_den, reg_den


def row_weights(is_reg: torch.Tensor, a: float, num_items_in_batch=None, num_registers_in_batch=None) -> torch.Tensor:
    """(N,) weight of each loss row in ``(1-a) * L_ntp + a * L_reg`` (what the chunked loss sums)."""
    n_reg = int(is_reg.sum())
    ntp_den, reg_den = _denominators(len(is_reg) - n_reg, n_reg, num_items_in_batch, num_registers_in_batch)
    dev = is_reg.device
    return torch.where(is_reg, torch.as_tensor(a / reg_den, device=dev, dtype=torch.float32),
                       torch.as_tensor((1.0 - a) / ntp_den, device=dev, dtype=torch.float32))


def objective_output(ce: torch.Tensor, is_reg: torch.Tensor, reg_hit: torch.Tensor, reg_choice: torch.Tensor,
                     num_offsets: int, a: float, num_items_in_batch=None, num_registers_in_batch=None,
                     loss: Optional[torch.Tensor] = None, **extra: Any) -> MuToROutput:
    """``(1-a) * L_ntp + a * L_reg`` and every reported mean, from per-row cross-entropies: the one division.

    ``ce`` (N,) cross-entropy of each loss row, ``is_reg`` (N,) which rows are registers (or head targets),
    ``reg_hit`` (n_reg,) top-1 hits and ``reg_choice`` (n_reg,) offset indices of the register rows in row
    order. ``loss``: already computed (the chunked loss weights its rows with :func:`row_weights`), else
    formed here. ``num_items_in_batch`` / ``num_registers_in_batch``: the accumulated batch's counts.
    """
    n_reg = int(is_reg.sum())
    n_ntp = len(ce) - n_reg
    ntp_den, reg_den = _denominators(n_ntp, n_reg, num_items_in_batch, num_registers_in_batch)
    ce_reg = ce[is_reg]                                                                  # (n_reg,)
    ntp_sum, reg_sum = ce[~is_reg].sum(), ce_reg.sum()
    ntp_loss, reg_loss = ntp_sum / ntp_den, reg_sum / reg_den
    if loss is None:
        loss = ntp_loss if a == 0 else (1.0 - a) * ntp_loss + a * reg_loss
    with torch.no_grad():
        dev = ce.device
        hits = reg_hit.float()
        count_k = torch.bincount(reg_choice, minlength=num_offsets).float()               # (K,)
        loss_k = torch.zeros(num_offsets, device=dev).index_add_(0, reg_choice, ce_reg.detach().float())
        hit_k = torch.zeros(num_offsets, device=dev).index_add_(0, reg_choice, hits)
        denom_k = torch.where(count_k > 0, count_k, torch.nan)   # no register of an offset: NaN, not 0
    return MuToROutput(
        loss=loss, ntp_loss=ntp_loss, reg_loss=reg_loss, reg_accuracy=hits.sum() / max(n_reg, 1),
        reg_loss_per_offset=loss_k / denom_k, reg_accuracy_per_offset=hit_k / denom_k, reg_count_per_offset=count_k,
        num_registers=n_reg, num_ntp_tokens=n_ntp, ntp_loss_sum=ntp_sum.detach(), reg_loss_sum=reg_sum.detach(),
        reg_loss_sum_per_offset=loss_k, reg_hits_per_offset=hit_k, **extra)


# ------------------------------------------------------------------ the base model
def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a wrapper keeps its own trainable parameters in next to a base of ``dtype``: float32 under a
    half-precision base (bf16/fp16 weights cannot hold AdamW's small steps), else the base's own."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def inner_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def check_loss_chunking(inner: nn.Module, loss_chunk_size: Optional[int], owner: str) -> None:
    """A ValueError unless ``loss_chunk_size`` is None, or a positive int on a model whose logits are
    ``lm_head(decoder(...).last_hidden_state)`` (a plain nn.Linear, no logit scaling) - what the
    chunked loss (mutor.core.loss) recomputes."""
    if loss_chunk_size is None:
        return
    if isinstance(loss_chunk_size, bool) or not isinstance(loss_chunk_size, int) or loss_chunk_size < 1:
        raise ValueError(f"{owner} loss_chunk_size must be None or a positive integer, got {loss_chunk_size!r}")
    name, hf_config = type(inner).__name__, getattr(inner, "config", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    odd = [k for k in ("logit_scale", "logits_scaling", "output_multiplier_scale") if getattr(hf_config, k, None)]
    if type(head) is not nn.Linear or odd or not hasattr(inner, "get_decoder"):
        raise ValueError(f"{name}: loss_chunk_size needs a plain nn.Linear output layer and no logit scaling "
                         f"(found {type(head).__name__}{', ' + ', '.join(odd) if odd else ''}); "
                         "use loss_chunk_size=None (logits through the model's own head)")


def accepts(fn, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name`` (explicitly or through ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def labels_of(batch: dict) -> torch.Tensor:
    """A batch's labels; without any, every non-padding token."""
    from ..core.layout import IGNORE_INDEX

    ids, am, labels = batch["input_ids"], batch.get("attention_mask"), batch.get("labels")
    if labels is not None:
        return labels
    return ids if am is None else ids.masked_fill(am == 0, IGNORE_INDEX)


def counted_for(counted: Any, labels: torch.Tensor) -> Any:
    """``counted`` (what :meth:`TrainingWrapper.count_reg_targets` left under ``COUNTED_LAYOUT``: a layout, or
    a list of them) when it was built for a batch of ``labels``' shape and device, else None (the forward then
    builds its own: e.g. a DataParallel replica, which gets a slice of the batch and the whole batch's layout)."""
    first = counted[0] if isinstance(counted, (list, tuple)) and counted else counted
    ntp = getattr(first, "ntp_labels", None)
    return counted if ntp is not None and ntp.shape == labels.shape and ntp.device == labels.device else None


def prepare_inputs(input_ids, attention_mask, labels, position_ids, device):
    """Check shapes, move to ``device``; labels default to every non-padding token."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    for name, t in (("attention_mask", attention_mask), ("position_ids", position_ids), ("labels", labels)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; it must match input_ids {tuple(input_ids.shape)}")
    input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    if labels is None:
        labels = labels_of({"input_ids": input_ids, "attention_mask": attention_mask})
    return input_ids, attention_mask, labels.to(device)


def load_base_model(path: Path, **model_kwargs: Any) -> nn.Module:
    """The base model of a wrapper checkpoint: a peft adapter on its recorded base (a saved random init
    too), trainable, or else a plain transformers checkpoint."""
    if (path / "adapter_config.json").is_file():
        from ..utils.errors import load_peft_model

        return load_peft_model(path, is_trainable=True, **model_kwargs)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), **model_kwargs)


def split_gathered_state_dict(state_dict: dict, own_keys: list[str], owner: str) -> tuple[dict, dict]:
    """Split a wrapper's full state dict (what FSDP / DeepSpeed ZeRO-3 gather for saving) in two.

    Returns the base model's part with the ``base_model.`` prefix stripped (so it saves as a vanilla
    transformers / peft checkpoint) and the wrapper's own part (``own_keys``). A tensor that is still a
    sharded DTensor, a missing wrapper key or a key of neither part is an error: writing it would give a
    checkpoint with a shard or a placeholder in it.
    """
    base, own, stray = {}, {}, []
    for k, v in state_dict.items():
        if type(v).__name__ == "DTensor":
            raise ValueError(f"{owner}.save_pretrained: state_dict[{k!r}] is a sharded DTensor, not a gathered "
                             "tensor; pass the full state dict (FSDP state_dict_type FULL_STATE_DICT)")
        if k.startswith("base_model."):
            base[k[len("base_model."):]] = v
        elif k in own_keys:
            own[k] = v
        else:
            stray.append(k)
    missing = [k for k in own_keys if k not in own] + ([] if base else ["base_model.*"])
    if missing or stray:
        raise ValueError(f"{owner}.save_pretrained: state_dict is not this wrapper's full state dict: "
                         f"missing {missing[:3]}, unexpected {stray[:3]}")
    return base, own


# ------------------------------------------------------------------ the base class
class TrainingWrapper(nn.Module):
    """``base`` (a transformers ``*ForCausalLM`` or a peft model around one) plus a training objective.

    A subclass sets ``config_class``, ``config_file`` / ``config_attr`` (its sidecar file and attribute name),
    ``weights_file`` (None without parameters of its own), ``options`` (constructor arguments that are not
    saved), and implements ``forward``, :meth:`count_reg_targets` and :meth:`offset_names`.
    """

    config_file: str = ""
    config_attr: str = ""
    config_class: type = type(None)
    weights_file: Optional[str] = None
    sidecar_prefix: str = ""                  # dropped from the state-dict keys in the weights file
    returns_logits: bool = False              # forward(return_logits=True) gives the regular rows' logits
    options: tuple[str, ...] = ("loss_chunk_size",)

    def __init__(self, base: nn.Module, loss_chunk_size: Optional[int] = None, what: Optional[str] = None):
        super().__init__()
        inner = inner_model(base)
        if getattr(inner, "config", None) is None or not hasattr(inner, "get_input_embeddings"):
            raise TypeError(f"{type(inner).__name__} is not a transformers PreTrainedModel; {type(self).__name__} "
                            "wraps *ForCausalLM models")
        check_supported(inner, *(() if what is None else (what,)))   # ALiBi, recurrent, chunked (mutor.core.support)
        check_loss_chunking(inner, loss_chunk_size, type(self).__name__)
        self.windows = attention_windows(inner.config)                 # raises for chunked / linear attention
        self.loss_chunk_size = loss_chunk_size
        self._logits_to_keep = "logits_to_keep" in inspect.signature(inner.forward).parameters
        self.base_model = base

    @property
    def config(self):
        """The base model's transformers config (so tooling that reads ``model.config`` keeps working)."""
        return inner_model(self.base_model).config

    @property
    def attn_implementation(self) -> str:
        return self.config._attn_implementation or "eager"

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def require_mask_support(self, what: str) -> None:
        """A ValueError naming the model unless its attention backend takes mutor's masks (``what`` needs them)."""
        from ..core.masks import SUPPORTED_ATTENTION

        if self.attn_implementation not in SUPPORTED_ATTENTION:
            raise ValueError(f"{type(inner_model(self.base_model)).__name__} uses attn_implementation="
                             f"{self.attn_implementation!r}, which cannot take {what}; load the model with "
                             "attn_implementation='sdpa' (or 'eager', or 'flex_attention' on GPU)")

    def register_free_mask(self, labels, attention_mask, position_ids, prefix_attention: str):
        """mutor's attention rule with no register (bidirectional prefix, packed documents, sliding windows):
        the mask for this model's backend and the layout's position ids. Nothing is drawn from any RNG."""
        from ..core.layout import regular_layout
        from ..core.masks import build_attention_mask

        layout = regular_layout(labels, prefix_attention, attention_mask, position_ids)
        dtype = self.get_input_embeddings().weight.dtype
        return build_attention_mask(layout, self.attn_implementation, self.windows, dtype), layout

    def logits_at(self, run: dict, keep: torch.Tensor) -> torch.Tensor:
        """(N, V) logits through the model's own head at the loss rows ``keep`` (B, L): a boolean
        ``logits_to_keep`` where the model takes one, else its full logits indexed."""
        if not self._logits_to_keep:
            return self.base_model(**run).logits[keep]
        return self.base_model(**run, logits_to_keep=keep).logits

    def chunked_loss(self, run: dict, keep, targets, is_reg, a: float, num_items_in_batch, num_registers_in_batch):
        """Decoder hidden states at the loss rows, then projection + cross-entropy in chunks (mutor.core.loss);
        returns ``(loss, ce, hit)``."""
        from ..core.loss import head_cross_entropy

        inner = inner_model(self.base_model)
        hs = inner.get_decoder()(**run).last_hidden_state                                  # (B, L, C)
        weights = row_weights(is_reg, a, num_items_in_batch, num_registers_in_batch)
        return head_cross_entropy(inner, hs[keep], targets, weights, self.loss_chunk_size)

    def parameter_groups(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(the model's trainable parameters, the wrapper's own): the two groups that gradient clipping keeps
        apart by default (:mod:`mutor.integrations.clipping`)."""
        model, own = [], []
        for n, p in self.named_parameters():
            if p.requires_grad:
                (model if n.startswith("base_model.") else own).append(p)
        return model, own

    def floating_point_ops(self, inputs: dict) -> int:
        """Trainer's FLOPs estimate for one forward + backward (6 x positions x non-embedding parameters, as
        transformers counts a plain model) for what this wrapper runs: the regular tokens through the model, plus
        :meth:`extra_position_params` (MuToR's registers through the model, the Multi-Token heads over every
        regular position)."""
        params = inner_model(self.base_model).num_parameters(exclude_embeddings=True)
        return 6 * (int(inputs["input_ids"].numel()) * params + self.extra_position_params(inputs, params))

    def extra_position_params(self, inputs: dict, params: int) -> int:
        """Sum over the extra work of positions x parameters (``params``: the model's); 0 by default."""
        return 0

    def num_added_parameters(self) -> int:
        """Parameters the method adds to the base model (registers, heads; none for next-token)."""
        return sum(p.numel() for n, p in self.named_parameters() if not n.startswith("base_model."))

    def generate(self, *args, **kwargs):
        """Plain generation with the base model: nothing the method adds plays a part at inference."""
        return self.base_model.generate(*args, **kwargs)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs) -> None:
        """Recompute the base model's activations in backward (Trainer's ``gradient_checkpointing``)."""
        base = self.base_model
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=activation_checkpointing_kwargs,
                                                 **kwargs)
        else:                                          # transformers before the rename
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs, **kwargs)

    def activation_checkpointing_disable(self) -> None:
        base = self.base_model
        if hasattr(base, "activation_checkpointing_disable"):
            base.activation_checkpointing_disable()
        else:
            base.gradient_checkpointing_disable()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs) -> None:
        """TRL's and peft's name for :meth:`activation_checkpointing_enable` (no deprecation warning)."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether the base model recomputes activations (what Trainer and TRL ask; no deprecated alias)."""
        return any(getattr(m, "gradient_checkpointing", False) for m in self.base_model.modules())

    is_gradient_checkpointing = is_activation_checkpointing   # TRL's name for it, answered without a warning

    def get_input_embeddings(self) -> nn.Module:
        return self.base_model.get_input_embeddings()

    # ------------------------------------------------------------ what the trainer asks
    def count_reg_targets(self, batch: dict) -> int:
        """Auxiliary targets this wrapper will train on for ``batch`` (may fix random choices in ``batch``, and may
        leave the layout it built under ``batch[COUNTED_LAYOUT]``, which the forward then reuses)."""
        raise NotImplementedError

    def offset_names(self) -> list[str]:
        """Names of the per-offset entries of the output (``reg_loss_per_offset`` ...)."""
        raise NotImplementedError

    def rng_state(self) -> Optional[torch.Tensor]:
        """State of a private offset generator (None when the method has none, or uses the global RNG)."""
        return None

    def set_rng_state(self, state: torch.Tensor) -> None:
        raise ValueError(f"this {type(self).__name__} has no private generator")

    # ------------------------------------------------------------ checkpoints
    def _own_state(self) -> dict:
        """The wrapper's own parameters (and buffers), under their state-dict names."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("base_model.")}

    def save_pretrained(self, save_directory: Union[str, os.PathLike], state_dict: Optional[dict] = None,
                        **kwargs: Any) -> None:
        """Write the base model's own checkpoint plus the sidecar, atomically.

        The base model is saved exactly as transformers / peft would save it, so the directory loads with
        ``AutoModelForCausalLM.from_pretrained`` (or peft) without mutor; the sidecar (``config_file``, and
        ``weights_file`` for a wrapper with parameters of its own) is what :meth:`from_pretrained` reads back.
        Everything goes to a temporary sibling directory first, which then replaces ``save_directory``: a crash
        never leaves a half-written checkpoint behind.

        Args:
            save_directory: The checkpoint directory; replaced if it exists.
            state_dict: This wrapper's full state dict as FSDP / DeepSpeed ZeRO-3 gather it (``base_model.*``
                and the wrapper's own keys); under those the parameters held by each process are shards or
                empty placeholders, so both parts are written from it. None: the parameters themselves.
            **kwargs: Passed on to the base model's ``save_pretrained``.

        Raises:
            ValueError: ``state_dict`` is not this wrapper's full, gathered state dict.
        """
        from safetensors.torch import save_file

        own = self._own_state()
        base_sd = None
        if state_dict is not None:
            base_sd, own = split_gathered_state_dict(state_dict, list(own), type(self).__name__)

        def fill(tmp: Path) -> None:
            self.base_model.save_pretrained(tmp, **({} if base_sd is None else {"state_dict": base_sd}), **kwargs)
            n = len(self.sidecar_prefix)
            tensors = {k[n:]: v.detach().cpu().contiguous() for k, v in own.items()}
            if self.rng_state() is not None:
                tensors["generator_state"] = self.rng_state()
            if self.weights_file is not None:
                save_file(tensors, str(tmp / self.weights_file), metadata={"format": "pt", "library": "mutor"})
            (tmp / self.config_file).write_text(self.method_config.to_json_string())

        replace_directory(save_directory, fill)

    def load_sidecar(self, path: Union[str, os.PathLike], parameters: bool = True) -> None:
        """Load what only mutor knows from a checkpoint directory.

        The base model's weights are not touched (Trainer resumes them from the vanilla checkpoint).

        Args:
            path: A directory written by :meth:`save_pretrained`.
            parameters: Load the wrapper's own parameters; False: only the offset generator's state (e.g. after
                FSDP loaded the whole wrapper).

        Raises:
            ValueError: The saved parameters do not fit this wrapper (missing, unexpected or reshaped).
        """
        from safetensors.torch import load_file

        if self.weights_file is None:
            return
        file = Path(path) / self.weights_file
        state = load_file(str(file))
        generator = state.pop("generator_state", None)
        state = {self.sidecar_prefix + k: v for k, v in state.items()}
        if parameters:
            own = self._own_state()
            missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            wrong = [k for k in own if k in state and state[k].shape != own[k].shape]
            if missing or unexpected or wrong:
                shapes = ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in wrong[:3])
                raise ValueError(f"{file} does not fit this {type(self).__name__}: missing {missing[:3]}, "
                                 f"unexpected {unexpected[:3]}" + (f", shapes {shapes}" if wrong else ""))
            self.load_state_dict(state, strict=False)
        if generator is not None and self.rng_state() is not None:
            self.set_rng_state(generator)

    @classmethod
    def wrap(cls, base: nn.Module, config, loss_chunk_size: Optional[int] = None) -> nn.Module:
        """The module a trainer trains for this method (:mod:`mutor.methods.registry`): the wrapper."""
        return cls(base, config, loss_chunk_size=loss_chunk_size)

    @property
    def method_config(self):
        """The method's config (``mutor_config``, ``multi_token_config``, ...), by one name for every wrapper."""
        return getattr(self, self.config_attr)

    @property
    def loss_weight(self) -> float:
        """The weight ``a`` of the auxiliary loss in ``(1 - a) * L_ntp + a * L_reg`` (0 for next-token)."""
        return float(getattr(self.method_config, "loss_weight", 0.0))

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike], base: Optional[nn.Module] = None,
                        **kwargs: Any) -> "TrainingWrapper":
        """Restore a wrapper saved by :meth:`save_pretrained` (a peft adapter directory works too).

        Args:
            path: The checkpoint directory.
            base: The base model, already loaded; None: loaded from ``path`` (a peft adapter on its recorded
                base, trainable, or a plain transformers checkpoint).
            **kwargs: The constructor's ``options`` (e.g. ``loss_chunk_size``: not saved, since they change how
                the loss is computed, not what is learned); the rest go to the base model's ``from_pretrained``.

        Returns:
            The wrapper, with its config, own parameters and offset generator state as saved.

        Raises:
            FileNotFoundError: ``path`` lacks the wrapper's sidecar files (e.g. a plain transformers checkpoint).
        """
        path = Path(path)
        for f in (cls.config_file, cls.weights_file):
            if f is not None and not (path / f).is_file():
                raise FileNotFoundError(f"{path} has no {f}: not a checkpoint written by {cls.__name__}."
                                        "save_pretrained (a plain transformers checkpoint loads with "
                                        "AutoModelForCausalLM)")
        options = {k: kwargs.pop(k) for k in cls.options if k in kwargs}
        config = cls.config_class.from_dict({**cls.config_class.sidecar_defaults,
                                               **json.loads((path / cls.config_file).read_text())})
        if base is None:
            base = load_base_model(path, **kwargs)
        model = cls(base, config, **options)
        model.load_sidecar(path)
        return model
