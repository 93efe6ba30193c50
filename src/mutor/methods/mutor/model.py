"""MuToRModel: the register objective around any transformers causal LM, unmodified.

Nothing of the base model is forked or patched. One forward pass:

1. ``layout.build_layout`` samples an offset per row and decides every register;
2. token embeddings come from the model's own input embedding (so Gemma's
   sqrt(hidden) scaling and LoRA on embeddings apply), register vectors from
   ``register_embeddings``, times that same embedding scale (the official code's
   ``<reg>`` is a vocabulary row, scaled with the rest); both are concatenated into
   ``inputs_embeds``;
3. ``masks.build_attention_mask`` turns the layout into the mask the model's
   attention backend needs, and explicit ``position_ids`` carry the offsets; under
   ``sdpa`` the register rows are computed apart from the regular ones
   (:mod:`mutor.core.attention`), so the unused register-register block costs nothing;
4. the base model runs with a boolean ``logits_to_keep`` so the vocabulary
   projection (and any model-specific logit processing, e.g. Gemma 2
   soft-capping) is done only at rows that carry a loss.

Registers never reach the saved checkpoint: ``save_pretrained`` writes the base
model exactly as transformers/peft would, plus a sidecar (``mutor.safetensors``,
``mutor_config.json``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...core.attention import split_attention_for
from ...core.layout import RegisterLayout, build_layout, sample_offsets
from ...core.loss import top1_hits
from ...core.masks import build_attention_mask
from ...models.activation_checkpointing import is_recomputing
from ...models.peft_utils import inner_model
from ..base import (
    COUNTED_LAYOUT,
    TargetCount,
    TrainingWrapper,
    accepts,
    counted_for,
    labels_of,
    master_dtype,
    prepare_inputs,
)
from ..objective import MuToROutput, objective_output
from .config import SIDECAR_CONFIG, MuToRConfig

__all__ = ["MuToRModel", "SIDECAR_WEIGHTS"]

SIDECAR_WEIGHTS = "mutor.safetensors"


class MuToRModel(TrainingWrapper):
    """A causal LM trained with MuToR: register tokens inserted into each batch predict tokens further ahead.

    The base model is not modified: the registers enter through ``inputs_embeds`` and ``position_ids`` under a
    custom attention mask, and their one learnable vector (or one per offset) lives here, in
    ``register_embeddings``. At inference, and in every checkpoint, the base model is all there is.

    Args:
        base: A transformers ``*ForCausalLM`` (or a peft model around one) whose forward takes
            ``inputs_embeds``, ``position_ids`` and ``attention_mask``, loaded with ``sdpa``, ``eager`` or
            ``flex_attention`` attention.
        config: The objective's settings (default: ``MuToRConfig()``).
        attention: ``"auto"``: under sdpa, register rows attend apart from the regular rows, so the unused
            register-register block costs nothing; ``"dense"``: one (T+R) x (T+R) mask.
        loss_chunk_size: None: logits through the model's own head. A positive int: the output projection and
            cross-entropy computed this many rows at a time (less memory; needs a plain linear output layer and
            no logit scaling).

    Raises:
        TypeError: ``base`` is not a transformers model, or its forward lacks an argument MuToR needs.
        ValueError: ``attention`` is neither ``"auto"`` nor ``"dense"``, the model's family or attention
            backend is not supported, or ``loss_chunk_size`` is not allowed for it.
    """

    config_class, config_file, config_attr = MuToRConfig, SIDECAR_CONFIG, "mutor_config"
    weights_file = SIDECAR_WEIGHTS
    returns_logits = True
    options = ("attention", "loss_chunk_size")

    def __init__(self, base: nn.Module, config: Optional[MuToRConfig] = None, attention: str = "auto",
                 loss_chunk_size: Optional[int] = None):
        if attention not in ("auto", "dense"):
            raise ValueError(f"MuToRModel attention must be 'auto' (split register rows under sdpa) or 'dense' "
                             f"(one (T+R)x(T+R) mask), got {attention!r}")
        super().__init__(base, loss_chunk_size)
        self.attention = attention
        self.mutor_config = config if config is not None else MuToRConfig()
        inner = inner_model(base)
        name = type(inner).__name__
        for arg in ("inputs_embeds", "position_ids", "attention_mask"):
            if not accepts(inner.forward, arg):
                raise TypeError(f"{name}.forward does not accept `{arg}`; MuToR injects registers through "
                                "inputs_embeds and position_ids with a custom attention mask, so it needs a model "
                                "whose forward takes them (most transformers causal LMs do)")
        self.require_mask_support("MuToR's custom attention mask")

        emb = base.get_input_embeddings()
        # fp32 master weights under a bf16/fp16 base (as peft keeps LoRA adapters): AdamW's small steps survive;
        # the vectors are cast to the token embeddings' dtype where they enter the model (_embed)
        self.register_embeddings = nn.Embedding(
            self.mutor_config.num_register_embeddings, emb.weight.shape[1], device=emb.weight.device,
            dtype=master_dtype(emb.weight.dtype))
        self._generator = None
        if self.mutor_config.seed is not None:
            self._generator = torch.Generator().manual_seed(self.mutor_config.seed)
        self._init_registers(emb)

    @torch.no_grad()
    def _init_registers(self, emb: nn.Module) -> None:
        """Normal init whose input-space values have the per-coordinate std of embedded tokens (after any
        model-side scaling): in table space, that std divided by the embedding scale."""
        vocab = emb.weight.shape[0]
        ids = torch.linspace(0, vocab - 1, min(vocab, 4096), device=emb.weight.device).long()
        std = emb(ids[None]).float().std().item()                                      # (1, n, C) -> scalar
        scale = self._embedding_scale()
        if scale is not None:
            std /= float(scale)
        w = torch.randn(self.register_embeddings.weight.shape, generator=self._generator) * std
        self.register_embeddings.weight.copy_(w.to(self.register_embeddings.weight))

    def _embedding_scale(self) -> Optional[Union[torch.Tensor, float]]:
        """The factor the model's token embedding multiplies its table rows by (Gemma's sqrt(hidden), kept in
        ``embed_scale`` by transformers' scaled word embeddings; under peft, on the wrapped layer), or None:
        no scale, or ``register_embedding_scale`` off."""
        if not self.mutor_config.register_embedding_scale:
            return None
        emb = self.base_model.get_input_embeddings()
        for module in (emb, getattr(emb, "base_layer", None)):
            scale = getattr(module, "embed_scale", None)
            if scale is not None:
                return scale
        return None

    def register_inputs(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The register vectors ``register_embeddings(index)`` as they enter the model, in ``dtype``: cast, then
        multiplied by the model's embedding scale as its embedding multiplies a vocabulary row (the scale cast
        to ``dtype`` first, as transformers' scaled word embeddings do)."""
        reg = self.register_embeddings(index).to(dtype)                                   # (..., C)
        scale = self._embedding_scale()
        if scale is None:
            return reg
        return reg * (scale.to(dtype) if torch.is_tensor(scale) else scale)

    # ------------------------------------------------------------ what the trainer asks
    def count_reg_targets(self, batch: dict) -> TargetCount:
        """Samples the per-row offsets now (with the model's own generator when it has one; a batch's own
        ``offset_index`` is kept) and counts the registers they give. The count does not depend on which random
        subset ``num_registers`` later picks, only on how many are eligible; without ``num_registers`` the labels
        and the offsets fix the whole layout, which goes to the forward too (``COUNTED_LAYOUT``). With it, the
        forward places its registers itself, drawing where it always has.

        Args:
            batch: A collated batch; not changed.

        Returns:
            The register count, and the forward inputs that fix it: the offsets drawn (``offset_index``) and,
            without ``num_registers``, the layout.
        """
        labels, inputs = labels_of(batch), {}
        if "offset_index" in batch:
            offsets = batch["offset_index"]
        else:
            offsets = inputs["offset_index"] = sample_offsets(self.mutor_config, labels.shape[0], self._generator)
        layout = build_layout(labels, self.mutor_config, batch.get("attention_mask"), batch.get("position_ids"),
                              offsets, generator=torch.Generator())
        if self.mutor_config.num_registers is None:
            inputs[COUNTED_LAYOUT] = layout
        return TargetCount(layout.num_registers, inputs)

    def offset_names(self) -> list[str]:
        """Labels of the per-offset outputs: ``"d=3"``, or ``"dh=2,dw=1"`` in 2D mode."""
        return self.mutor_config.offset_names()

    def extra_position_params(self, inputs: dict, params: int) -> int:
        """Each register runs through the whole model: registers x ``params``, for a batch whose offsets the
        trainer has drawn (none counted otherwise: counting must not draw from any RNG)."""
        if COUNTED_LAYOUT in inputs:
            return inputs[COUNTED_LAYOUT].num_registers * params
        return (self.count_reg_targets(inputs).count if "offset_index" in inputs else 0) * params

    def rng_state(self) -> Optional[torch.Tensor]:
        """State of the private offset generator (None when the global RNG is used)."""
        return None if self._generator is None else self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore the private offset generator (what :meth:`rng_state` returned).

        Raises:
            ValueError: The model has no private generator (``MuToRConfig.seed`` is None).
        """
        if self._generator is None:
            raise ValueError("this MuToRModel has no private generator (MuToRConfig.seed is None)")
        self._generator.set_state(state)

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        offset_index: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[Union[int, torch.Tensor]] = None,
        num_registers_in_batch: Optional[Union[int, torch.Tensor]] = None,
        return_logits: bool = False,
        counted_layout: Optional[RegisterLayout] = None,
        **kwargs: Any,
    ) -> MuToROutput:
        """One training forward: registers placed, the model run once, both losses computed.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T), 1 on tokens and 0 on padding.
            labels: (B, T) aligned with ``input_ids``, -100 where no loss (prompt, padding), as for a plain causal
                LM; None: every non-padding token.
            position_ids: (B, T) per-document positions: packed documents neither attend to each other nor
                share registers.
            offset_index: (B,) each row's offset, as an index into ``config.offset_choices()``; None: drawn.
            num_items_in_batch: Next-token targets in the whole accumulated batch, the next-token loss's
                denominator (token-weighted means under gradient accumulation); None: this batch's.
            num_registers_in_batch: Registers in the whole accumulated batch, the register loss's denominator;
                None: this batch's.
            return_logits: Also return the logits of every loss row and the layout.
            counted_layout: The layout :meth:`count_reg_targets` built for this batch (in its
                ``forward_inputs``, which the trainer hands on), used instead of building it again.
            **kwargs: Passed on to the base model.

        Returns:
            A :class:`~mutor.MuToROutput`: the loss, its next-token and register parts, and the register loss
            and accuracy per offset.
        """
        input_ids, attention_mask, labels = prepare_inputs(input_ids, attention_mask, labels, position_ids, self.device)
        cfg = self.mutor_config
        layout = counted_for(counted_layout, labels)
        if layout is None:
            layout = build_layout(labels, cfg, attention_mask, position_ids, offset_index, self._generator)
        inputs_embeds = self._embed(input_ids, layout)                                    # (B, T+R, C)
        mask = build_attention_mask(layout, self.attn_implementation, self.windows, inputs_embeds.dtype)
        keep, targets, is_reg = layout.loss_rows()                                        # (B, T+R), (N,), (N,)
        run = dict(inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=layout.position_ids,
                   use_cache=False, **kwargs)
        with self._attention_context(layout, mask):
            if self.loss_chunk_size is None:
                logits, ce, hit = self._full_loss(run, keep, targets)
                loss = None
            else:
                logits = None
                loss, ce, hit = self.chunked_loss(run, keep, targets, is_reg, cfg.loss_weight, num_items_in_batch,
                                                  num_registers_in_batch)
        return objective_output(
            ce, is_reg, hit[is_reg], layout.reg_choice[layout.reg_valid], len(cfg.offset_choices()),
            cfg.loss_weight, num_items_in_batch, num_registers_in_batch, loss=loss,
            logits=logits if return_logits else None, layout=layout if return_logits else None)

    def _embed(self, input_ids: torch.Tensor, layout: RegisterLayout) -> torch.Tensor:
        """Token embeddings from the model's own input embedding, then the register vectors."""
        tok = self.base_model.get_input_embeddings()(input_ids)                          # (B, T, C)
        shared = self.mutor_config.register_embedding != "per_offset"
        rows = torch.zeros_like(layout.reg_choice) if shared else layout.reg_choice
        reg = self.register_inputs(rows, tok.dtype)                                       # (B, R, C)
        return torch.cat([tok, reg], dim=1)                                               # (B, T+R, C)

    def _attention_context(self, layout: RegisterLayout, mask):
        """Under sdpa, register rows attend apart from regular rows (mutor.core.attention). Gradient checkpointing
        recomputes layers outside this forward, where the split is off: then the dense mask is used."""
        inner = inner_model(self.base_model)
        checkpointing = self.training and is_recomputing(inner)
        split = (self.attention == "auto" and self.attn_implementation == "sdpa" and layout.num_slots > 0
                 and not checkpointing)
        return split_attention_for(inner, layout.num_regular, mask) if split else contextlib.nullcontext()

    def _full_loss(self, run: dict, keep: torch.Tensor, targets: torch.Tensor):
        """Logits through the model's own head, only at loss rows, and their cross-entropy and top-1 hits."""
        logits = self.logits_at(run, keep)                                                # (N, V)
        ce = F.cross_entropy(logits.float(), targets, reduction="none")                   # (N,)
        return logits, ce, top1_hits(logits, targets)
