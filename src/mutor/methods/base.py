"""One base for the training-time wrappers: MuToR, the Multi-Token baseline and the next-token baseline.

A wrapper holds an unmodified transformers causal LM (or a peft model around one) as ``base_model``
and adds a training objective on top; at inference, and in every checkpoint, the base model is all
there is. What the three share lives here once:

* the checks on the base model (a transformers causal LM of a family mutor handles exactly, and a
  ``loss_chunk_size`` its output layer allows) and the pass-throughs that Trainer and generation use;
* the inputs a forward takes (:func:`prepare_inputs`, :func:`labels_of`) and the two ways to the loss rows'
  logits (the model's own head at a boolean ``logits_to_keep``, or the chunked projection); the division into
  the objective is :mod:`mutor.methods.objective`, saving and restoring :mod:`mutor.methods.checkpoint`;
* what the trainer asks of any wrapper: :meth:`~TrainingWrapper.count_reg_targets` (the accumulated-batch
  denominator), :meth:`~TrainingWrapper.offset_names` (per-offset logs) and the offset generator's state.

What is unusual: the count comes before the forward, and building what it counts is most of a forward's
bookkeeping (MuToR's offsets and layout, the Multi-Token heads' targets). ``count_reg_targets`` therefore
returns, beside the count, the forward's keyword arguments that carry what it built (:class:`TargetCount`);
the trainer adds them to the micro-batch, so its layout is built once and its offsets are the counted ones.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..core.masks import attention_windows
from ..core.support import check_supported
from ..models.activation_checkpointing import ActivationCheckpointing
from ..models.peft_utils import inner_model
from .checkpoint import SidecarCheckpoint
from .objective import row_weights

__all__ = ["COUNTED_LAYOUT", "TargetCount", "TrainingWrapper", "labels_of", "master_dtype", "prepare_inputs"]


COUNTED_LAYOUT = "counted_layout"   # the forward's keyword for the layout count_reg_targets built


@dataclass(frozen=True)
class TargetCount:
    """A batch's auxiliary targets, as :meth:`TrainingWrapper.count_reg_targets` counts them before its forward.

    Attributes:
        count: Auxiliary targets (registers, or the Multi-Token heads' targets) the batch trains on.
        forward_inputs: Keyword arguments for the batch's forward that fix what was counted: MuToR's
            ``offset_index`` when it drew the offsets, and the layout it built (``COUNTED_LAYOUT``); {} when
            nothing needs fixing.
    """

    count: int
    forward_inputs: dict = field(default_factory=dict)


# ------------------------------------------------------------------ the base model
def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a wrapper keeps its own trainable parameters in next to a base of ``dtype``: float32 under a
    half-precision base (bf16/fp16 weights cannot hold AdamW's small steps), else the base's own."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def check_loss_chunking(inner: nn.Module, loss_chunk_size: Optional[int], owner: str) -> None:
    """A ValueError unless ``loss_chunk_size`` is None, or a positive int on a model whose logits are
    ``lm_head(decoder(...).last_hidden_state)`` (a plain nn.Linear, no logit scaling) - what the
    chunked loss (mutor.core.loss) recomputes."""
    if loss_chunk_size is None:
        return
    if isinstance(loss_chunk_size, bool) or not isinstance(loss_chunk_size, int) or loss_chunk_size < 1:
        raise ValueError(f"{owner} loss_chunk_size must be None or a positive integer, got {loss_chunk_size!r}")
    odd = odd_head(inner)
    if odd:
        raise ValueError(f"{type(inner).__name__}: loss_chunk_size needs a plain nn.Linear output layer and no "
                         f"logit scaling (found {odd}); use loss_chunk_size=None (logits through the model's own "
                         "head)")


def odd_head(inner: nn.Module) -> Optional[str]:
    """None where ``inner``'s logits are ``lm_head(get_decoder()(...).last_hidden_state)``, with ``lm_head`` a plain
    nn.Linear and no logit scaling (final soft-capping aside): what the chunked loss and a drafting round's head
    product recompute. Else what is in the way."""
    hf_config = getattr(inner, "config", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    odd = [k for k in ("logit_scale", "logits_scaling", "output_multiplier_scale") if getattr(hf_config, k, None)]
    if type(head) is not nn.Linear or odd or not hasattr(inner, "get_decoder"):
        return type(head).__name__ + (", " + ", ".join(odd) if odd else "")
    return None


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
    """``counted`` (what :meth:`TrainingWrapper.count_reg_targets` built, handed on as ``COUNTED_LAYOUT``: a
    layout, or a list of them) when it was built for a batch of ``labels``' shape and device, else None (the
    forward then builds its own: e.g. a DataParallel replica, which gets a slice of the batch and the whole
    batch's layout)."""
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


# ------------------------------------------------------------------ the base class
class TrainingWrapper(SidecarCheckpoint, ActivationCheckpointing, nn.Module):
    """``base`` (a transformers ``*ForCausalLM`` or a peft model around one) plus a training objective.

    A subclass sets ``config_class``, ``config_file`` / ``config_attr`` (its sidecar file and attribute name),
    ``weights_file`` (None without parameters of its own), ``options`` (constructor arguments that are not
    saved), and implements ``forward``, :meth:`count_reg_targets` and :meth:`offset_names`. Saving and
    restoring come from :class:`~mutor.methods.checkpoint.SidecarCheckpoint`, the checkpointing switches that
    Trainer, TRL and peft call from :class:`~mutor.models.activation_checkpointing.ActivationCheckpointing`.
    """

    config_attr: str = ""
    returns_logits: bool = False              # forward(return_logits=True) gives the regular rows' logits

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
        """The base model's attention backend (``sdpa``, ``eager``, ``flex_attention``, ...)."""
        return self.config._attn_implementation or "eager"

    @property
    def device(self) -> torch.device:
        """Where the wrapper's inputs go: the device of its first parameter."""
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

    def get_input_embeddings(self) -> nn.Module:
        """The base model's token embedding."""
        return self.base_model.get_input_embeddings()

    # ------------------------------------------------------------ what the trainer asks
    def count_reg_targets(self, batch: dict) -> TargetCount:
        """The auxiliary targets this wrapper will train on for ``batch``, counted before its forward.

        ``batch`` is not changed: what the count fixed (offsets drawn, the layout built) comes back in
        :attr:`TargetCount.forward_inputs`, for the caller to pass to this batch's forward.

        Args:
            batch: A collated batch (``input_ids``, ``labels``, ``attention_mask``, ``position_ids``, ...).

        Returns:
            The count, and the forward's keyword arguments that make it the batch's.
        """
        raise NotImplementedError

    def offset_names(self) -> list[str]:
        """Names of the per-offset entries of the output (``reg_loss_per_offset`` ...)."""
        raise NotImplementedError

    def rng_state(self) -> Optional[torch.Tensor]:
        """State of a private offset generator (None when the method has none, or uses the global RNG)."""
        return None

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore the private offset generator; a ValueError for a method without one."""
        raise ValueError(f"this {type(self).__name__} has no private generator")

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
