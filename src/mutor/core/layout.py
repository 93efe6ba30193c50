"""Where the registers go: a vectorized description of one training batch.

Physical placement (our choice, equivalent under the mask and position ids):
the R register slots of a row are *appended* after its T regular tokens, so
the model sees ``L = T + R`` tokens. The regular stream is left untouched,
which keeps the regular part of every tensor contiguous and lets the regular
logits be compared 1:1 with a plain forward. R is the largest register count
in the batch; shorter rows get invalid slots that attend only to themselves
and are never supervised.

Indices below are 0-based. A register after regular token ``x_t`` targets
``x_{t+d}`` and gets position id ``pos[t] + d - 1``: the position of the
regular token that would predict ``x_{t+d}`` under next-token prediction.
With ``loss_weight == 0`` no register is placed (only the attention rule, e.g. a
bidirectional prefix, remains: that is how the next-token baseline trains with the
paper's prefix attention). A register is *eligible* when its target is supervised (label != -100, not
padding) and lies in the same document as ``x_t`` (documents come from
``position_ids`` restarting, as in packed batches, and from padding), and, under the
paper's placement rule (``register_placement="within_answer"``, the default; paper 3.3:
"we interleave register tokens only within the answer sequence", and the official code builds
``[r, a1, r, a2, ...]`` after the prompt), when the next token ``x_{t+1}`` is supervised too:
registers sit only within the answer, the first one after the last prompt token. With
``"supervised_target"`` the last d-1 prompt tokens get registers as well. In 2D
mode a register is placed only after grid tokens and only where its 2D
target ``(row + d_h - 1, col + d_w - 1)`` is inside the grid: a target past
the right edge would wrap to the next raster row, so it is not placed; one
past the bottom does not exist in the sequence, so it is not placed either.

The attention rule, in terms of the per-token tensors this module builds
(query q, key k, both indices into the L-long stream)::

    allowed(q, k) = q == k
                    or (key_ok[k] and doc[k] == doc[q] and k <= limit[q]
                        and pos[q] - pos[k] < window)

``key_ok`` is False for registers and padding, so no token ever sees a
register but itself. ``limit`` is q itself for a regular token in causal mode
(the last prompt token for a prompt token in bidirectional-prefix mode) and
the source token's limit for a register: a register sees exactly what its
source token ``x_t`` sees, plus itself. The window (sliding-window layers) is
measured on position ids, so a register keeps the window of the token whose
position it borrows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch

IGNORE_INDEX = -100


class OffsetConfig(Protocol):
    """What the layout reads of the objective's settings: :class:`~mutor.MuToRConfig` has all of it (the
    layout takes any object that does, so this engine does not import the method that configures it)."""

    loss_weight: float
    num_registers: Optional[int]
    register_placement: str
    prefix_attention: str
    grid_width: Optional[int]
    grid_start: int

    @property
    def is_2d(self) -> bool:
        """Whether offsets are 2D ``(d_h, d_w)`` pairs over an image grid."""

    def offset_choices(self) -> list[tuple[int, ...]]:
        """The offsets drawn uniformly: ``(d,)`` in 1D, ``(d_h, d_w)`` in 2D."""

    def raster_offset(self, choice: tuple[int, ...]) -> int:
        """The sequence offset d of one choice."""


@dataclass
class RegisterLayout:
    """Where the registers of one batch go, as per-token tensors (built by :func:`build_layout`).

    B rows of T regular tokens followed by R register slots, L = T + R tokens in all; R is the largest register
    count of a row, and shorter rows have empty slots. The attention rule these tensors define is in the
    module's docstring.

    Attributes:
        position_ids: (B, L) position id of every token, registers included.
        doc_ids: (B, L) document id; -1 for padding and empty slots.
        limit: (B, L) the last regular index a token may attend to.
        key_ok: (B, L) whether other tokens may attend to this one (regular, not padding).
        ntp_labels: (B, T) next-token labels, shifted as transformers shifts them.
        reg_source: (B, R) index t of the regular token each register follows.
        reg_labels: (B, R) each register's target token id; -100 on empty slots.
        reg_choice: (B, R) each register's offset, as an index into ``config.offset_choices()``.
        reg_valid: (B, R) whether the slot holds a register.
        offset_index: (B,) the offset choice of each row.
    """

    position_ids: torch.Tensor
    doc_ids: torch.Tensor
    limit: torch.Tensor
    key_ok: torch.Tensor
    ntp_labels: torch.Tensor
    reg_source: torch.Tensor
    reg_labels: torch.Tensor
    reg_choice: torch.Tensor
    reg_valid: torch.Tensor
    offset_index: torch.Tensor

    @property
    def num_regular(self) -> int:
        """T, the regular tokens per row."""
        return self.ntp_labels.shape[1]

    @property
    def num_slots(self) -> int:
        """R, the register slots per row."""
        return self.reg_source.shape[1]

    @property
    def num_registers(self) -> int:
        """Registers in the batch (valid slots)."""
        return int(self.reg_valid.sum())

    def loss_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows of the (T+R) sequence that carry a loss.

        Returns:
            ``(keep, targets, is_reg)``: ``keep`` (B, T+R) marks the N loss rows; ``targets`` (N,) and ``is_reg``
            (N,) are their targets and whether each is a register, in the order of every per-row tensor of a
            forward (logits, losses).
        """
        targets = torch.cat([self.ntp_labels, self.reg_labels], 1)                       # (B, T+R)
        keep = targets != IGNORE_INDEX                                                    # (B, T+R)
        is_reg = torch.cat([torch.zeros_like(self.ntp_labels, dtype=torch.bool), self.reg_valid], 1)[keep]  # (N,)
        return keep, targets[keep], is_reg


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) next-token targets: position t is scored on ``labels[t+1]``, the last on nothing (transformers'
    shift, so that labels stay aligned with ``input_ids`` everywhere else)."""
    out = torch.full_like(labels, IGNORE_INDEX)
    out[:, :-1] = labels[:, 1:]
    return out


def _document_starts(position_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: a new document starts where positions do not continue or padding toggles."""
    start = torch.ones_like(attention_mask)
    start[:, 1:] = (position_ids[:, 1:] != position_ids[:, :-1] + 1) | (attention_mask[:, 1:] != attention_mask[:, :-1])
    return start


def sample_offsets(config: OffsetConfig, batch_size: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """(B,) indices into ``config.offset_choices()``, uniform, on the CPU."""
    return torch.randint(len(config.offset_choices()), (batch_size,), generator=generator)


def build_layout(
    labels: torch.Tensor,
    config: OffsetConfig,
    attention_mask: Optional[torch.Tensor] = None,
    position_ids: Optional[torch.Tensor] = None,
    offset_index: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> RegisterLayout:
    """Decide every register of a batch. All work is batched tensor ops on ``labels.device``.

    Steps, top to bottom: the regular stream (documents, supervision, attention limits), one offset
    per row, which tokens may carry a register, which of them get a slot, and the registers' own
    position ids, labels and attention. Random draws (``generator``, else torch's global RNG), in this
    order: the offsets (when ``offset_index`` is None), then the placement (when ``num_registers`` is set).

    Args:
        labels: (B, T) labels aligned with the input ids, -100 where no loss (prompt, padding).
        config: The objective's settings (offsets, placement rule, prefix attention, 2D grid).
        attention_mask: (B, T), 1 on tokens and 0 on padding; None: no padding.
        position_ids: (B, T) per-document positions of packed sequences; None: one document per row.
        offset_index: (B,) each row's offset, as an index into ``config.offset_choices()``; None: drawn.
        generator: The random numbers for the draws; None: torch's global RNG.

    Returns:
        The batch's :class:`RegisterLayout`.

    Raises:
        ValueError: Shapes that do not match, or an ``offset_index`` out of range.
    """
    s = _RegularStream.of(labels, config.prefix_attention, attention_mask, position_ids)
    offset_index, d = _row_offsets(config, s.ar.shape[0], s.dev, offset_index, generator)  # (B,), (B,)
    eligible = _eligible_sources(config, s, offset_index, d)                         # (B, T)
    src, valid = _register_slots(config.num_registers, eligible, generator)         # (B, R), (B, R)
    return _with_registers(s, labels, d, src, valid, offset_index)


def offset_target_layout(labels: torch.Tensor, d: int, attention_mask: Optional[torch.Tensor] = None,
                         position_ids: Optional[torch.Tensor] = None) -> RegisterLayout:
    """A register after every ``x_t`` whose ``x_{t+d}`` is supervised and in the same document (the placement
    ``"supervised_target"`` at the one offset ``d``, causal, no cap): where the Multi-Token baseline's head
    ``d`` has a target. ``reg_source`` holds the positions, ``reg_labels`` the targets. Nothing is drawn."""
    s = _RegularStream.of(labels, "causal", attention_mask, position_ids)
    B = s.ar.shape[0]
    dd = torch.full((B,), d, dtype=torch.long, device=s.dev)                         # (B,)
    src, valid = _register_slots(None, _target_in_document(s, dd), None)            # (B, R), (B, R)
    return _with_registers(s, labels, dd, src, valid, torch.zeros(B, dtype=torch.long, device=s.dev))


def _with_registers(s: "_RegularStream", labels: torch.Tensor, d: torch.Tensor, src: torch.Tensor,
                    valid: torch.Tensor, offset_index: torch.Tensor) -> RegisterLayout:
    """The layout of registers at ``src`` (B, R) (``valid`` slots; row offsets ``d``): each targets x_{t+d},
    takes the position id of x_{t+d-1}, its source's document and its source's attention limit."""
    B, T = s.ar.shape
    R = src.shape[1]
    reg_tgt = (src + d[:, None]).clamp(max=T - 1)
    reg_labels = torch.where(valid, labels.gather(1, reg_tgt), IGNORE_INDEX)        # (B, R)
    reg_pos = torch.where(valid, s.pos.gather(1, src) + d[:, None] - 1, 0)          # (B, R)
    reg_doc = torch.where(valid, s.doc.gather(1, src), -1)
    reg_limit = torch.where(valid, s.limit.gather(1, src), 0)
    return RegisterLayout(
        position_ids=torch.cat([s.pos, reg_pos], 1),                                 # (B, T+R)
        doc_ids=torch.cat([s.doc, reg_doc], 1),
        limit=torch.cat([s.limit, reg_limit], 1),
        key_ok=torch.cat([s.am, torch.zeros_like(valid)], 1),
        ntp_labels=shift_labels(labels),
        reg_source=src,
        reg_labels=reg_labels,
        reg_choice=offset_index[:, None].expand(B, R),
        reg_valid=valid,
        offset_index=offset_index,
    )


def regular_layout(labels: torch.Tensor, prefix_attention: str = "causal",
                   attention_mask: Optional[torch.Tensor] = None,
                   position_ids: Optional[torch.Tensor] = None) -> RegisterLayout:
    """The batch with no register: documents, supervision and the regular tokens' attention rule. What the
    next-token baseline and the Multi-Token trunk train under, and what decoding encodes a prompt with (all
    labels ignored: the whole prompt is the prefix). Nothing is drawn from any RNG."""
    s = _RegularStream.of(labels, prefix_attention, attention_mask, position_ids)
    zeros = torch.zeros(s.ar.shape[0], dtype=torch.long, device=s.dev)                # (B,)
    none = zeros[:, None][:, :0]                                                     # (B, 0): no register slot
    return _with_registers(s, labels, zeros, none, none.bool(), zeros)


@dataclass
class _RegularStream:
    """The regular tokens of a batch, each (B, T): indices, non-padding, position ids, documents, supervision
    and attention limits (the rule of the module docstring, before any register)."""

    dev: torch.device
    ar: torch.Tensor
    am: torch.Tensor
    pos: torch.Tensor
    doc: torch.Tensor
    supervised: torch.Tensor
    limit: torch.Tensor

    @classmethod
    def of(cls, labels: torch.Tensor, prefix_attention: str, attention_mask: Optional[torch.Tensor],
           position_ids: Optional[torch.Tensor]) -> "_RegularStream":
        if labels.dim() != 2:
            raise ValueError(f"labels must be (batch, seq_len), got shape {tuple(labels.shape)}")
        B, T = labels.shape
        dev = labels.device
        am = torch.ones_like(labels, dtype=torch.bool) if attention_mask is None else attention_mask.to(dev).bool()
        ar = torch.arange(T, device=dev).expand(B, T)                               # (B, T)
        pos = ar if position_ids is None else position_ids.to(dev).long()          # (B, T)
        if am.shape != (B, T) or pos.shape != (B, T):
            raise ValueError(f"attention_mask {tuple(am.shape)} and position_ids {tuple(pos.shape)} must match "
                             f"labels {(B, T)}")
        start = _document_starts(pos, am)                                           # (B, T)
        doc = torch.where(am, start.long().cumsum(1) - 1, -1)                        # (B, T)
        supervised = (labels != IGNORE_INDEX) & am                                  # (B, T)
        limit = _regular_limits(prefix_attention, ar, am, start, doc, supervised)   # (B, T)
        return cls(dev, ar, am, pos, doc, supervised, limit)


def _regular_limits(
    prefix_attention: str, ar: torch.Tensor, am: torch.Tensor, start: torch.Tensor, doc: torch.Tensor,
    supervised: torch.Tensor,
) -> torch.Tensor:
    """(B, T) attention limit of each regular token: itself, or under a bidirectional prefix the last
    prompt token of its document for a prompt token (the prompt ends before the first answer token)."""
    B, T = ar.shape
    limit = ar.clone()
    if prefix_attention == "bidirectional":
        target_idx = torch.where(supervised & ~start, ar, T)                        # first answer token per doc
        first = torch.full((B, T), T, device=ar.device, dtype=torch.long)
        first = first.scatter_reduce(1, doc.clamp(min=0), target_idx, reduce="amin")
        answer_start = first.gather(1, doc.clamp(min=0))                            # (B, T)
        in_prefix = am & (ar < answer_start)
        limit = torch.where(in_prefix, answer_start - 1, ar).clamp(max=T - 1)
    return limit


def _row_offsets(
    config: OffsetConfig, B: int, dev: torch.device, offset_index: Optional[torch.Tensor],
    generator: Optional[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offset_index, d)``, both (B,): each row's offset choice (sampled when not given) and its
    sequence offset d (the raster offset in 2D mode)."""
    choices = config.offset_choices()
    if offset_index is None:
        offset_index = sample_offsets(config, B, generator)
    offset_index = offset_index.to(dev).long()
    if offset_index.shape != (B,) or bool((offset_index < 0).any()) or bool((offset_index >= len(choices)).any()):
        raise ValueError(f"offset_index must be ({B},) with values in [0, {len(choices)})")
    d_table = torch.tensor([config.raster_offset(c) for c in choices], device=dev)
    return offset_index, d_table[offset_index]                                      # (B,), (B,)


def _target_in_document(s: "_RegularStream", d: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: x_{t+d} (``d`` per row) exists, is supervised and lies in x_t's document."""
    T = s.ar.shape[1]
    tgt = s.ar + d[:, None]                                                         # (B, T)
    tgt_c = tgt.clamp(max=T - 1)
    return (tgt < T) & s.supervised.gather(1, tgt_c) & (s.doc.gather(1, tgt_c) == s.doc) & s.am


def _eligible_sources(config: OffsetConfig, s: "_RegularStream", offset_index: torch.Tensor,
                      d: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: regular token x_t may carry a register (the eligibility rule of the module docstring)."""
    eligible = _target_in_document(s, d)
    if config.register_placement == "within_answer":                                 # paper 3.3
        next_supervised = torch.zeros_like(s.supervised)
        # (B, T): x_{t+1} is an answer token
        next_supervised[:, :-1] = s.supervised[:, 1:] & (s.doc[:, 1:] == s.doc[:, :-1])
        eligible &= next_supervised
    if config.loss_weight == 0:
        eligible = torch.zeros_like(eligible)     # a=0: registers would cost compute and teach nothing
    if config.is_2d:
        dw = torch.tensor([c[1] for c in config.offset_choices()], device=s.dev)[offset_index]  # (B,)
        rel = s.pos - config.grid_start
        eligible &= (rel >= 0) & ((rel % config.grid_width) + dw[:, None] - 1 < config.grid_width)
    return eligible


def _register_slots(
    num_registers: Optional[int], eligible: torch.Tensor, generator: Optional[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, valid)``, both (B, R): the source index of each register slot, sorted, valid ones
    first (0 on empty slots), and whether the slot holds a register. R is the largest count in the batch.
    All eligible tokens, or ``num_registers`` of them drawn at random (one (B, T) CPU draw)."""
    B, T = eligible.shape
    dev = eligible.device
    ar = torch.arange(T, device=dev).expand(B, T)                                   # (B, T)
    if num_registers is None:
        key = torch.where(eligible, ar, ar + T)
        src = key.sort(dim=1).values                                                # (B, T)
    else:
        score = torch.rand((B, T), generator=generator).to(dev)
        score = torch.where(eligible, score, 2.0)
        k = min(num_registers, T)
        picked = score.topk(k, dim=1, largest=False).indices                         # (B, k)
        ok = eligible.gather(1, picked)
        src = torch.where(ok, picked, picked + T).sort(dim=1).values
    counts = eligible.sum(1) if num_registers is None else eligible.sum(1).clamp(max=num_registers)
    R = int(counts.max()) if B > 0 else 0
    src = src[:, :R]
    valid = torch.arange(R, device=dev)[None, :] < counts[:, None]                  # (B, R)
    return torch.where(valid, src, 0), valid
