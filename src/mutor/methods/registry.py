"""The methods mutor trains, by name: the one table that says which wrapper, config and sidecar files each has.

``mutor train`` (building the model a recipe names), ``MuToRSFTTrainer`` (wrapping the model SFTTrainer
built) and the evaluation harness (reading back how a run was trained) look a method up here instead of
naming the three methods themselves. Each method is a folder beside this module, as peft's
``tuners/<method>/``: its config dataclass (``config.py``, a :class:`~mutor.core.config.JsonConfig` with
``prefix_attention``), its :class:`~mutor.methods.base.TrainingWrapper` subclass (``model.py``, which names
its sidecar files), and an ``__init__.py`` that calls :func:`register_method`; :mod:`mutor.methods` imports
the folders, so every lookup here finds them. A method defined elsewhere registers itself the same way.

What is unusual: a method's recipe options live in a recipe block named after the method (``mutor:``,
``multi_token:``); the next-token baseline has none. ``prefix_attention`` is a run-wide recipe setting
that every method's config carries (the paper gives every method the same prompt attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from torch import nn

from ..utils.errors import did_you_mean
from .base import TrainingWrapper

__all__ = ["Method", "METHODS", "get_method", "method_names", "method_of_config", "method_of_run",
           "register_method"]


@dataclass(frozen=True)
class Method:
    """One training method: its name, wrapper class and recipe block (None: the method has no options)."""

    name: str
    wrapper_class: type[TrainingWrapper]
    recipe_block: Optional[str]
    description: str

    @property
    def config_class(self) -> type:
        """The method's config dataclass (its wrapper's ``config_class``)."""
        return self.wrapper_class.config_class

    @property
    def sidecar_files(self) -> tuple[str, ...]:
        """The files a checkpoint of this method holds besides the vanilla model (config, then weights)."""
        w = self.wrapper_class
        return (w.config_file,) + ((w.weights_file,) if w.weights_file else ())

    def config(self, options: Optional[dict] = None, prefix_attention: str = "causal", **task_settings: Any):
        """The method's config from its recipe options, the run's prefix attention and what the task decides
        (fields the config class does not have are not passed to it)."""
        fields = set(self.config_class.__dataclass_fields__)
        return self.config_class.from_dict({**(options or {}), "prefix_attention": prefix_attention,
                                            **{k: v for k, v in task_settings.items() if k in fields}})

    def wrap(self, base: nn.Module, config, loss_chunk_size: Optional[int] = None) -> nn.Module:
        """The module a trainer trains: ``wrapper_class.wrap`` (the next-token baseline's may be ``base`` itself)."""
        if not isinstance(config, self.config_class):
            raise TypeError(f"method {self.name!r} takes a {self.config_class.__name__}, got {type(config).__name__}")
        return self.wrapper_class.wrap(base, config, loss_chunk_size=loss_chunk_size)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` to the table under its name (a method's package calls this when imported).

    Args:
        method: The method: name, wrapper class, recipe block and a one-line description.

    Returns:
        ``method``.

    Raises:
        ValueError: A method of that name is already registered.
    """
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def method_names() -> tuple[str, ...]:
    """The names of the registered methods, in registration order."""
    return tuple(METHODS)


def get_method(name: str) -> Method:
    """The registered method ``name``, or a ValueError naming the known ones (and the closest)."""
    if name not in METHODS:
        hint = did_you_mean([name], list(METHODS))
        raise ValueError(f"unknown method {name!r}: one of {list(METHODS)}{'; ' + hint if hint else ''}")
    return METHODS[name]


def method_of_config(config) -> Method:
    """The method whose config class ``config`` is an instance of (``MuToRSFTTrainer(mutor_config=...)``)."""
    for m in METHODS.values():
        if isinstance(config, m.config_class):
            return m
    raise TypeError(f"{type(config).__name__} is not the config of a mutor method "
                    f"({', '.join(m.config_class.__name__ for m in METHODS.values())})")


def method_of_run(directory: Union[str, Path]) -> Optional[Method]:
    """The method whose sidecar config file a checkpoint directory holds (None: a plain model)."""
    d = Path(directory)
    return next((m for m in METHODS.values() if (d / m.wrapper_class.config_file).is_file()), None)
