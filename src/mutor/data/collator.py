"""Batching for every method: right padding, or padding-free packing with per-document position ids.

Examples are dicts of ``input_ids`` and ``labels`` lists (-100 where there is no loss),
already aligned (the models shift labels themselves, as transformers does). Two ways to batch:

* :class:`PaddingCollator` right-pads ``input_ids`` (with the pad id), ``labels`` (with -100)
  and builds ``attention_mask``: what a normal SFT collator makes.
* ``packing=True`` uses transformers' own ``DataCollatorWithFlattening``: the batch becomes
  one row of concatenated examples with ``position_ids`` restarting at 0 for each, and
  ``labels`` set to -100 on each example's first token. MuToR's layout reads documents from
  those position ids, so no attention and no register target crosses an example; plain
  transformers models do the same when no attention mask is given. With ``num_registers``
  set, the fixed number of registers applies per packed row.

Prompts for batched generation are padded on the left instead (:func:`left_pad`), so that every
row's next token is the last position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.layout import IGNORE_INDEX

__all__ = ["PaddingCollator", "left_pad", "make_collator"]


@dataclass
class PaddingCollator:
    """Right-pad a list of examples into ``input_ids``, ``attention_mask``, ``labels`` (and ``position_ids``)."""

    pad_token_id: int = 0

    def __call__(self, features: Sequence[dict]) -> dict:
        """Collate ``features`` into right-padded ``(B, T)`` tensors; raise ``ValueError`` on a malformed example."""
        if not features:
            raise ValueError("cannot collate an empty list of examples")
        for f in features:
            if "input_ids" not in f or "labels" not in f:
                raise ValueError(f"every example needs 'input_ids' and 'labels'; got keys {sorted(f)}")
            if len(f["input_ids"]) != len(f["labels"]):
                raise ValueError(f"input_ids ({len(f['input_ids'])}) and labels ({len(f['labels'])}) differ in length")
        T = max(len(f["input_ids"]) for f in features)
        B = len(features)
        ids = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        with_pos = "position_ids" in features[0]
        pos = torch.zeros((B, T), dtype=torch.long) if with_pos else None
        for b, f in enumerate(features):
            n = len(f["input_ids"])
            ids[b, :n] = torch.as_tensor(f["input_ids"], dtype=torch.long)
            labels[b, :n] = torch.as_tensor(f["labels"], dtype=torch.long)
            mask[b, :n] = 1
            if with_pos:
                pos[b, :n] = torch.as_tensor(f["position_ids"], dtype=torch.long)
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if with_pos:
            batch["position_ids"] = pos
        return batch


def make_collator(pad_token_id: int, packing: bool = False):
    """The collator a recipe asks for (``data.packing``)."""
    if packing:
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE_INDEX)
    return PaddingCollator(pad_token_id=pad_token_id)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts for batched generation: (ids, attention_mask), each (B, longest prompt)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        if len(s):
            ids[b, T - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[b, T - len(s):] = 1
    return ids, mask
