"""How many positions a transformers model has, and which field of its config says so.

Training rows and generations must fit in them: a model with learned position embeddings (GPT-2's
``n_positions``) fails with an index error past them, and a rotary one (Llama's ``max_position_embeddings``)
runs on silently, at positions it never saw in training. MuToR's registers need no position beyond a row's
own: a register after ``x_t`` that targets ``x_{t+d}`` (with ``t + d`` inside the row) takes the position
of ``x_{t+d-1}`` (:mod:`mutor.core.layout`), so the row length bounds every position id, and in a packed
batch, whose position ids restart with each document, the longest document does.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["position_limit"]

# what configs call the number of positions, most common first (GPT-2 and GPT-J map the first onto n_positions)
_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def position_limit(config: Any) -> Optional[tuple[int, str]]:
    """The number of positions a model's config gives, and the field that holds it.

    Args:
        config: A transformers ``PretrainedConfig`` (a multimodal one is read through its text config), or None.

    Returns:
        ``(positions, field)``, e.g. ``(1024, "n_positions")`` for GPT-2; None when the config names no limit
        (or there is no config).
    """
    if config is None:
        return None
    prefix = ""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not None and text is not config:
        config, prefix = text, "text_config."
    aliases = getattr(type(config), "attribute_map", None) or {}
    for name in _FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, prefix + aliases.get(name, name)
    return None
