"""The next-token baseline, when the plain model alone cannot be it: a bidirectional prefix or a chunked loss.

With a causal prefix and the model's own loss, ``mutor train`` trains the base model itself, exactly as a
plain ``Trainer`` would. The paper's fine-tuning setting gives every method a bidirectional prompt
(Appendix A), and ``loss_chunk_size`` computes every method's loss through the same chunked projection;
the baseline then needs the same mask and the same loss path as the other methods, and nothing else.
``NextTokenModel`` is that: no parameter of its own (nothing "added by the method"), no register, no
offset drawn from any RNG, and a sidecar of one config file (``next_token_config.json``) that records
the prefix attention the model was trained with, which evaluation reads back.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...core.layout import IGNORE_INDEX
from ..base import COUNTED_LAYOUT, TargetCount, TrainingWrapper, prepare_inputs
from ..objective import MuToROutput, objective_output
from .config import NT_CONFIG, NextTokenConfig

__all__ = ["NextTokenModel"]


class NextTokenModel(TrainingWrapper):
    """The next-token baseline under mutor's attention mask and loss path, with nothing added to the model.

    Needed only with a bidirectional prefix or a chunked loss; otherwise :meth:`wrap` returns the base model
    itself.

    Args:
        base: A transformers ``*ForCausalLM`` or a peft model around one.
        config: The baseline's settings (default: ``NextTokenConfig()``).
        loss_chunk_size: None: logits through the model's own head. A positive int: the output projection and
            cross-entropy computed this many rows at a time (less memory; needs a plain linear output layer).

    Raises:
        TypeError: ``base`` is not a transformers model.
        ValueError: The model's attention backend cannot take mutor's mask, or ``loss_chunk_size`` is not
            allowed for it.
    """

    config_class, config_file, config_attr = NextTokenConfig, NT_CONFIG, "next_token_config"

    def __init__(self, base: nn.Module, config: Optional[NextTokenConfig] = None,
                 loss_chunk_size: Optional[int] = None):
        super().__init__(base, loss_chunk_size)
        self.next_token_config = config if config is not None else NextTokenConfig()
        self.require_mask_support("mutor's attention mask (bidirectional prefix, packed documents)")

    @classmethod
    def wrap(cls, base: nn.Module, config: NextTokenConfig, loss_chunk_size: Optional[int] = None) -> nn.Module:
        """The module to train for this baseline.

        Args:
            base: The model.
            config: The baseline's settings.
            loss_chunk_size: As for the constructor.

        Returns:
            ``base`` itself when nothing differs from a plain model's training (causal prompt, the model's own
            loss); otherwise a ``NextTokenModel`` (the same mask or the same chunked loss as the other methods,
            and nothing else).
        """
        if config.prefix_attention == "causal" and loss_chunk_size is None:
            return base
        return cls(base, config, loss_chunk_size=loss_chunk_size)

    def count_reg_targets(self, batch: dict) -> TargetCount:
        """No auxiliary target, and nothing for the forward."""
        return TargetCount(0)

    def offset_names(self) -> list[str]:
        """Labels of the per-offset outputs: none, as there is no auxiliary target."""
        return []

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[Union[int, torch.Tensor]] = None,
        **kwargs: Any,
    ) -> MuToROutput:
        """The next-token loss of the base model under mutor's mask.

        The mask (:func:`mutor.core.masks.build_attention_mask`) applies the bidirectional prefix, packed
        documents and sliding windows; the loss goes through the chunked projection when configured.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T), 1 on tokens and 0 on padding.
            labels: (B, T) aligned with ``input_ids``, -100 where no loss; None: every non-padding token.
            position_ids: (B, T) per-document positions of packed sequences.
            num_items_in_batch: Next-token targets in the whole accumulated batch (the loss denominator).
            **kwargs: Passed on to the base model (MuToR-only keys are dropped).

        Returns:
            A :class:`~mutor.MuToROutput` with the loss and ``ntp_loss`` (no register in it).
        """
        for unused in ("offset_index", "num_registers_in_batch", COUNTED_LAYOUT):
            kwargs.pop(unused, None)
        input_ids, attention_mask, labels = prepare_inputs(input_ids, attention_mask, labels, position_ids,
                                                           self.device)
        mask, layout = self.register_free_mask(labels, attention_mask, position_ids,
                                               self.next_token_config.prefix_attention)
        keep = layout.ntp_labels != IGNORE_INDEX                                        # (B, T)
        targets = layout.ntp_labels[keep]                                               # (N,)
        is_reg = torch.zeros_like(targets, dtype=torch.bool)
        run = dict(input_ids=input_ids, attention_mask=mask, position_ids=layout.position_ids, use_cache=False,
                   **kwargs)
        if self.loss_chunk_size is None:
            loss, ce = None, F.cross_entropy(self.logits_at(run, keep).float(), targets, reduction="none")   # (N,)
        else:
            loss, ce, _ = self.chunked_loss(run, keep, targets, is_reg, 0.0, num_items_in_batch, None)
        empty = targets[:0]
        return objective_output(ce, is_reg, empty.bool(), empty, 0, 0.0, num_items_in_batch, loss=loss)
