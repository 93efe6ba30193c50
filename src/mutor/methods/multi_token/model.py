"""The Multi-Token baseline (Gloeckle et al., 2024) as the paper compares it, around an unmodified model.

Gloeckle et al. split the network into a shared trunk and one transformer layer per predicted
offset: the model's own last decoder layer is the next-token head, and ``d_max - 1`` extra
heads, each initialised as a copy of that last layer, predict ``x_{t+k}`` (k = 2..d_max) from
the trunk's output at ``t``. All heads share the model's final norm and output layer (and any
final logit soft-capping, e.g. Gemma 2). The loss is ``(1-a)·L_ntp + a·L_heads``, the same
weighting as MuToR, with ``L_heads`` the token-weighted mean over every head's targets.

What is unusual here: nothing of the modeling code is re-implemented. A forward pre-hook on
the last decoder layer records exactly what that layer receives (the trunk's hidden states and
the attention mask, rotary embeddings, position ids the model prepared for it); each extra head
is then called with the same arguments. Masks for padding, packed documents, sliding windows
and the bidirectional prefix therefore come from the model (or from mutor's mask builder)
exactly as for the next-token head. Families whose causal-LM class exposes ``model.layers``,
``model.norm`` and ``lm_head`` are supported (llama, mistral, qwen2/3, gemma 1/2/3, ...);
others are refused by name.

Heads are training-only: ``save_pretrained`` writes the base model exactly as transformers
(or peft) would, plus a sidecar with the heads so that training can resume.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...core.layout import IGNORE_INDEX, offset_target_layout, shift_labels
from ...core.loss import top1_hits
from ...models.peft_utils import inner_model
from ..base import COUNTED_LAYOUT, TargetCount, TrainingWrapper, counted_for, labels_of, master_dtype, prepare_inputs
from ..objective import MuToROutput, objective_output, row_weights
from .config import MT_CONFIG, MultiTokenConfig

MT_WEIGHTS = "multi_token.safetensors"

__all__ = ["MT_WEIGHTS", "MultiTokenModel"]


def _parts(inner: nn.Module):
    """(decoder layers, final norm, lm_head) of a *ForCausalLM, or a ValueError naming the class."""
    decoder = getattr(inner, "model", None)
    layers = getattr(decoder, "layers", None)
    norm = getattr(decoder, "norm", None)
    head = getattr(inner, "lm_head", None)
    if not isinstance(layers, nn.ModuleList) or norm is None or head is None:
        raise ValueError(f"the Multi-Token baseline supports causal LMs built as model.layers + model.norm + lm_head "
                         f"(llama, mistral, qwen2/3, gemma 1/2/3, ...); {type(inner).__name__} is not")
    return layers, norm, head


class MultiTokenModel(TrainingWrapper):
    """The Multi-Token baseline around a causal LM: ``d_max - 1`` extra heads, each a copy of the last decoder layer.

    Only for training: at inference, and in every checkpoint, the base model is all there is
    (``save_pretrained`` writes it as transformers / peft would, plus a sidecar with the heads).

    Args:
        base: A transformers ``*ForCausalLM`` built as ``model.layers`` + ``model.norm`` + ``lm_head`` (llama,
            mistral, qwen2/3, gemma 1/2/3, ...), or a peft model around one.
        config: The baseline's settings (default: ``MultiTokenConfig()``).
        loss_chunk_size: None: logits through the model's own head. A positive int: the output projection and
            cross-entropy computed this many rows at a time (less memory; needs a plain linear output layer).

    Raises:
        TypeError: ``base`` is not a transformers model.
        ValueError: The model's family or attention backend is not supported, or ``loss_chunk_size`` is not
            allowed for it.
    """

    config_class, config_file, config_attr = MultiTokenConfig, MT_CONFIG, "multi_token_config"
    weights_file, sidecar_prefix = MT_WEIGHTS, "heads."

    def __init__(self, base: nn.Module, config: Optional[MultiTokenConfig] = None,
                 loss_chunk_size: Optional[int] = None):
        super().__init__(base, loss_chunk_size, "the Multi-Token baseline")
        self.multi_token_config = config if config is not None else MultiTokenConfig()
        inner = inner_model(base)
        layers, _, _ = _parts(inner)
        if self.multi_token_config.prefix_attention == "bidirectional":
            self.require_mask_support("the bidirectional prefix mask")
        # fp32 master weights under a bf16/fp16 base (the heads train in full); _head_rows runs them under autocast
        dtype = master_dtype(inner.get_input_embeddings().weight.dtype)
        self.heads = nn.ModuleList(copy.deepcopy(layers[-1]).to(dtype)
                                   for _ in range(self.multi_token_config.d_max - 1))
        for p in self.heads.parameters():
            p.requires_grad_(True)          # a peft-frozen last layer still gives fully trainable heads

    # ------------------------------------------------------------ what the trainer asks
    def count_reg_targets(self, batch: dict) -> TargetCount:
        """Head ``k`` has a target at ``t`` when ``x_{t+k}`` is supervised and in the same document; the heads'
        target layouts go to the forward too (``COUNTED_LAYOUT``). Nothing is drawn from any RNG.

        Args:
            batch: A collated batch; not changed.

        Returns:
            The number of head targets, and the heads' layouts as the forward's input.
        """
        layouts = self._head_layouts(labels_of(batch), batch.get("attention_mask"), batch.get("position_ids"))
        return TargetCount(sum(lay.num_registers for lay in layouts), {COUNTED_LAYOUT: layouts})

    def _head_layouts(self, labels, attention_mask, position_ids) -> list:
        """Head ``k``'s targets for ``k`` = 2 .. d_max: every ``x_t`` whose ``x_{t+k}`` is supervised and in the same
        document (Gloeckle et al.'s objective, prompt positions included: not MuToR's within-answer register rule),
        as a layout with registers at offset ``k`` (:func:`mutor.core.layout.offset_target_layout`)."""
        return [offset_target_layout(labels, k, attention_mask, position_ids)
                for k in range(2, self.multi_token_config.d_max + 1)]

    def offset_names(self) -> list[str]:
        """Labels of the per-offset outputs, one per extra head: ``"d=2"`` .. ``"d={d_max}"``."""
        return [f"d={k}" for k in range(2, self.multi_token_config.d_max + 1)]

    def extra_position_params(self, inputs: dict, params: int) -> int:
        """Every head runs over every regular position (the shared output layer is not counted, as transformers
        leaves the embeddings out)."""
        return int(inputs["input_ids"].numel()) * self.num_added_parameters()

    # ----------------------------------------------------------------- forward
    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + output layer (+ final soft-capping) of the base model, for (N, C) rows."""
        inner = inner_model(self.base_model)
        _, norm, lm_head = _parts(inner)
        logits = lm_head(norm(hidden))                                                   # (N, V)
        cap = getattr(inner.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[Union[int, torch.Tensor]] = None,
        num_registers_in_batch: Optional[Union[int, torch.Tensor]] = None,
        counted_layout: Optional[list] = None,
        **kwargs: Any,
    ) -> MuToROutput:
        """One training forward: the next-token loss and every head's loss.

        Head ``k`` at position ``t`` targets ``labels[t+k]`` when it is supervised and in the same document.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T), 1 on tokens and 0 on padding.
            labels: (B, T) aligned with ``input_ids``, -100 where no loss (prompt, padding); None: every
                non-padding token.
            position_ids: (B, T) per-document positions of packed sequences.
            num_items_in_batch: Next-token targets in the whole accumulated batch (the loss denominator).
            num_registers_in_batch: Head targets in the whole accumulated batch (the trainer counts them).
            counted_layout: The heads' target layouts :meth:`count_reg_targets` built for this batch.
            **kwargs: Passed on to the base model.

        Returns:
            A :class:`~mutor.MuToROutput`: the loss, ``ntp_loss``, and the heads' losses and accuracies under the
            ``reg_*`` names (per head as per offset); no logits.
        """
        kwargs.pop("offset_index", None)
        input_ids, attention_mask, labels = prepare_inputs(input_ids, attention_mask, labels, position_ids,
                                                           self.device)
        base_mask, positions = self._prefix_mask(labels, attention_mask, position_ids)
        ntp_labels = shift_labels(labels)                                               # (B, T)
        keep = ntp_labels != IGNORE_INDEX                                               # (B, T)
        run = dict(input_ids=input_ids, attention_mask=base_mask, position_ids=positions, use_cache=False, **kwargs)
        trunk_out, head_input = self._trunk(run, keep)
        layouts = counted_for(counted_layout, labels) or self._head_layouts(labels, attention_mask, positions)
        head_rows, head_tgt = self._head_rows(head_input, layouts)
        counts = torch.tensor([len(t) for t in head_tgt], device=self.device)
        n_ntp = int(keep.sum())
        is_reg = torch.arange(n_ntp + int(counts.sum()), device=self.device) >= n_ntp    # (N + n_reg,)
        targets = torch.cat([ntp_labels[keep]] + head_tgt)                              # (N + n_reg,)
        if self.loss_chunk_size is None:
            loss, (ce, reg_hit) = None, self._full_loss(trunk_out, head_rows, targets, n_ntp)
        else:
            from ...core.loss import head_cross_entropy

            rows = torch.cat([trunk_out[keep]] + [self._norm(r) for r in head_rows])    # (N + n_reg, C)
            weights = row_weights(is_reg, self.multi_token_config.loss_weight, num_items_in_batch,
                                  num_registers_in_batch)
            loss, ce, hit = head_cross_entropy(inner_model(self.base_model), rows, targets, weights,
                                               self.loss_chunk_size)
            reg_hit = hit[n_ntp:]
        choice = torch.repeat_interleave(torch.arange(len(head_tgt), device=self.device), counts)   # (n_reg,)
        return objective_output(ce, is_reg, reg_hit, choice, len(head_tgt), self.multi_token_config.loss_weight,
                                num_items_in_batch, num_registers_in_batch, loss=loss)

    def _norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return _parts(inner_model(self.base_model))[1](hidden)

    def _prefix_mask(self, labels, attention_mask, position_ids):
        """With a bidirectional prefix, the mask (and position ids) of mutor's mask builder; else the model's own."""
        if self.multi_token_config.prefix_attention != "bidirectional":
            return attention_mask, position_ids
        mask, layout = self.register_free_mask(labels, attention_mask, position_ids, "bidirectional")
        return mask, layout.position_ids

    def _trunk(self, run: dict, keep: torch.Tensor):
        """The base model's forward (the decoder's normed hidden states for the chunked loss, else the (N, V)
        logits at ``keep``, :meth:`logits_at`), recording what its last decoder layer receives: the heads are
        called with the same."""
        inner = inner_model(self.base_model)
        layers = _parts(inner)[0]
        captured: dict = {}

        def grab(module, args, kw):
            captured["args"], captured["kwargs"] = args, kw

        handle = layers[-1].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            if self.loss_chunk_size is not None:   # decoder only: its (normed) hidden states, no logits
                out = inner.get_decoder()(**run).last_hidden_state                      # (B, T, C)
            else:
                out = self.logits_at(run, keep)                                         # (N, V)
        finally:
            handle.remove()
        return out, (captured["args"], dict(captured["kwargs"]))

    def _head_rows(self, head_input, layouts: list):
        """Each head's hidden states at its target positions (n_k, C), and the targets (n_k,)."""
        args, kw = head_input
        trunk = args[0] if args else kw.pop("hidden_states")                           # (B, T, C)
        rest = args[1:]
        rows, targets = [], []
        half = trunk.dtype in (torch.bfloat16, torch.float16) and next(self.heads.parameters()).dtype != trunk.dtype
        for head, lay in zip(self.heads, layouts):
            with torch.autocast(trunk.device.type, dtype=trunk.dtype) if half else contextlib.nullcontext():
                h = head(trunk, *rest, **kw)                   # fp32 master weights, computed in the trunk's dtype
            h = (h[0] if isinstance(h, tuple) else h).to(trunk.dtype)                   # (B, T, C)
            b = torch.arange(h.shape[0], device=h.device)[:, None].expand_as(lay.reg_source)
            rows.append(h[b[lay.reg_valid], lay.reg_source[lay.reg_valid]])             # (n_k, C)
            targets.append(lay.reg_labels[lay.reg_valid])                               # (n_k,)
        return rows, targets

    def _full_loss(self, ntp_logits, head_rows, targets, n_ntp):
        """Per-row cross-entropy (next-token rows, then every head's) and the heads' top-1 hits."""
        ces = [F.cross_entropy(ntp_logits.float(), targets[:n_ntp], reduction="none")]  # (N,)
        hits, start = [], n_ntp
        for rows in head_rows:
            logits = self._project(rows)                                                # (n_k, V)
            tgt = targets[start:start + len(rows)]
            start += len(rows)
            ces.append(F.cross_entropy(logits.float(), tgt, reduction="none"))
            hits.append(top1_hits(logits, tgt))
        return torch.cat(ces), torch.cat(hits)
