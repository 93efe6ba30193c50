"""Drafting with the registers: lossless self-speculative decoding from a MuToR run.

- ``drafter``: :class:`RegisterDrafter` (``model.generate(..., custom_generate=drafter)``) and
  :func:`generate` (``mutor.generate``), two entries to one loop;
- ``loop``: the round loop, apart from the model (the replay of recorded traces runs it too);
- ``forward``: the model side of a round (registers, masks, the cache);
- ``proposer``: what a round feeds, and what it learns from what was accepted;
- ``policy``: how much to draft (acceptance, the cost of a forward by its rows, the choice);
- ``stats``: the counts of a run;
- ``replay``: a policy replayed offline on recorded traces (the real loop, a table of forward costs).

Imports :mod:`mutor.methods`, :mod:`mutor.core` and :mod:`mutor.utils`; nothing below imports it.
"""

from .drafter import RegisterDrafter, generate
from .policy import DraftPolicy, DraftSettings, FixedDraft
from .stats import DraftStats

__all__ = ["DraftPolicy", "DraftSettings", "DraftStats", "FixedDraft", "RegisterDrafter", "generate"]
