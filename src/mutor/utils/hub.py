"""The Hugging Face Hub as mutor asks it: whether to ask at all, and how long one question may take.

What is unusual: mutor asks the Hub one short question before loading a model or a data set by its Hub id
(:func:`mutor.models.loading.hub_probe`, and the data sets' own probe), so that an offline machine fails in one
line after one attempt instead of after ``huggingface_hub``'s retries. ``HF_HUB_OFFLINE`` skips the question.
"""

from __future__ import annotations

import os

__all__ = ["HUB_PROBE_TIMEOUT_S", "is_offline"]

HUB_PROBE_TIMEOUT_S = 5.0


def is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (``1``, ``ON``, ``YES`` or ``TRUE``): the Hub is not asked."""
    return os.environ.get("HF_HUB_OFFLINE", "0").upper() in ("1", "ON", "YES", "TRUE")
