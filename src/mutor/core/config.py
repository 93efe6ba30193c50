"""What every method's config shares: JSON in and out (:class:`JsonConfig`) and the one check of
``prefix_attention``.

A method's config is a plain dataclass whose fields all carry ``metadata={"help": ...}``, so that
``transformers.HfArgumentParser`` and YAML recipes work with no extra code; it lives beside its model
(:class:`~mutor.MuToRConfig` in :mod:`mutor.methods.mutor.config`, and so on). What is unusual: a sidecar
config is read back over its class's ``sidecar_defaults`` (the value a field added later meant before it
existed), and :meth:`JsonConfig.from_dict` names any field the class does not have.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import ClassVar, Optional, TypeVar

__all__ = ["PREFIX_ATTENTION", "JsonConfig", "check_prefix_attention"]

PREFIX_ATTENTION = ("causal", "bidirectional")

_Config = TypeVar("_Config", bound="JsonConfig")


def check_prefix_attention(value: str, owner: str) -> str:
    """The one check of ``prefix_attention``, wherever it is given (every method's config, a recipe, decoding).

    Args:
        value: The value given.
        owner: Where it was given, to name in the message (e.g. ``"MuToRConfig.prefix_attention"``).

    Returns:
        ``value``, when it is ``"causal"`` or ``"bidirectional"``.

    Raises:
        ValueError: Any other value.
    """
    if value not in PREFIX_ATTENTION:
        raise ValueError(f"{owner}: must be causal or bidirectional (causal: ordinary causal attention; "
                         f"bidirectional: prompt tokens attend to the whole prompt), got {value!r}")
    return value


class JsonConfig:
    """``to_dict`` / ``from_dict`` (unknown fields named) / ``to_json_string`` for a method's config dataclass."""

    # Fields added after sidecars were first written, with the value a sidecar saved without them meant (the
    # behaviour of the code that wrote it); used when a checkpoint's sidecar config is read back.
    sidecar_defaults: ClassVar[dict] = {}

    def to_dict(self) -> dict:
        """Every field by name (what the checkpoint's sidecar config file holds)."""
        return asdict(self)

    @classmethod
    def from_dict(cls: type[_Config], data: dict) -> _Config:
        """The config of ``data``, checked as on construction.

        Args:
            data: Field values by name, e.g. a sidecar config file read back.

        Returns:
            The config.

        Raises:
            ValueError: ``data`` names a field this config does not have, or a value is out of range.
        """
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def to_json_string(self) -> str:
        """:meth:`to_dict` as indented JSON with sorted keys and a final newline."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def task_fields(cls, options: dict, task_settings: Optional[dict]) -> dict:
        """What the task decides in this config, given the user's ``options``.

        Args:
            options: The method's options from the recipe.
            task_settings: Settings the built task gives its method configs (e.g. an image task's
                ``grid_width``); None: the task is not built yet (a recipe checked on loading).

        Returns:
            The fields to set from the task: by default each of the task's settings that this config has a
            field for.
        """
        return {k: v for k, v in (task_settings or {}).items() if k in cls.__dataclass_fields__}
