"""Recipes: one YAML file says everything a ``mutor train`` run depends on.

A recipe has five blocks besides ``method`` and ``seed``: ``model`` (:class:`ModelArgs`),
``mutor`` (:class:`~mutor.MuToRConfig` fields), ``multi_token`` (the baseline's fields),
``lora`` (``peft.LoraConfig`` fields, or null), ``data`` (``task`` plus that task's options) and
``training`` (``transformers.TrainingArguments`` fields). Every block is validated against the
class that consumes it, so a misspelt key fails before anything is loaded, with its name.

Command-line overrides are ``dotted.key=value`` with the value parsed as YAML
(``training.learning_rate=1e-4``, ``method=[next_token,mutor]``, ``lora=null``).

Recipes ship inside the package (``mutor/configs``; the repository's ``configs/`` is a link to
it) and can be named without path or extension: ``star-graph`` finds ``configs/star-graph.yaml``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from .config import MuToRConfig

__all__ = ["ModelArgs", "Recipe", "METHODS", "CONFIG_DIR", "load_recipe", "apply_overrides", "find_recipe"]

METHODS = ("next_token", "mutor", "multi_token")


class _Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: only true/false are booleans (``save_strategy: no`` stays "no") and
    ``2e-5`` is a float, as a Python user expects."""


_Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:bool",
                                                                                 "tag:yaml.org,2002:float")]
                                   for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
               r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def yaml_load(text: str):
    return yaml.load(text, Loader=_Loader)
CONFIG_DIR = Path(__file__).parent / "configs"


@dataclass
class ModelArgs:
    name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Hub id or local directory of a causal LM (from_pretrained). None: a "
                                        "random-init model of `preset`."})
    preset: str = field(
        default="tiny-llama", metadata={"help": "Random-init architecture when name_or_path is None: a name in "
                                                "mutor.testing.PRESETS (tiny-llama, small-llama, ...)."})
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
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype must be float32, bfloat16 or float16 (got {self.dtype!r})")


@dataclass
class Recipe:
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
    model: ModelArgs = field(default_factory=ModelArgs, metadata={"help": "The model to train."})
    mutor: dict = field(default_factory=dict, metadata={"help": "MuToRConfig fields (method mutor)."})
    multi_token: dict = field(default_factory=dict, metadata={"help": "MultiTokenConfig fields (method "
                                                                      "multi_token)."})
    variants: dict = field(default_factory=dict, metadata={"help": "Named methods with their own settings, usable in "
                                                              "`method`: {mutor_2d: {method: mutor, mutor: {d_max_2d: 4}}}"
                                                              " (keys: method, mutor, multi_token)."})
    lora: Optional[dict] = field(default=None, metadata={"help": "peft.LoraConfig fields; None: full fine-tuning."})
    data: dict = field(default_factory=dict, metadata={"help": "`task` (a registered task name) and its options; "
                                                               "`packing: true` packs examples into one row."})
    training: dict = field(default_factory=dict, metadata={"help": "transformers.TrainingArguments fields."})

    source_dir: Optional[str] = field(
        default=None, metadata={"help": "Directory of the recipe file (set when loaded): relative data paths that "
                                        "do not exist from the working directory are looked up there."})

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            known = {f.name for f in dataclasses.fields(ModelArgs)}
            unknown = sorted(set(self.model) - known)
            if unknown:
                raise ValueError(f"recipe model: unknown key(s) {unknown}; known: {sorted(known)}")
            self.model = ModelArgs(**self.model)
        if not isinstance(self.variants, dict):
            raise ValueError("recipe variants must be a mapping of name -> {method, mutor, multi_token}")
        for name, v in self.variants.items():
            if name in METHODS or not isinstance(v, dict) or v.get("method") not in METHODS \
                    or set(v) - {"method", "mutor", "multi_token"}:
                raise ValueError(f"recipe variant {name!r} must be a new name with `method` in {list(METHODS)} and "
                                 f"optional `mutor`/`multi_token` settings (got {v!r})")
        for m in self.methods:
            if m not in METHODS and m not in self.variants:
                raise ValueError(f"recipe method {m!r} is not one of {list(METHODS)} nor a variant "
                                 f"({sorted(self.variants)})")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"recipe method lists {self.methods} with repeats")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"recipe threads must be a positive integer or null (got {self.threads!r})")
        if self.prefix_attention not in ("causal", "bidirectional"):
            raise ValueError(f"recipe prefix_attention must be causal or bidirectional (got {self.prefix_attention!r})")
        if not isinstance(self.data, dict) or "task" not in self.data:
            raise ValueError("recipe data needs a `task` (e.g. data: {task: gsm8k})")
        for blk in ("mutor", "multi_token", "training"):
            if not isinstance(getattr(self, blk), dict):
                raise ValueError(f"recipe {blk} must be a mapping (got {type(getattr(self, blk)).__name__})")
        if self.lora is not None and not isinstance(self.lora, dict):
            raise ValueError("recipe lora must be a mapping of peft.LoraConfig fields, or null")
        if "prefix_attention" in self.mutor and self.mutor["prefix_attention"] != self.prefix_attention:
            raise ValueError("set prefix_attention at the top of the recipe (it applies to every method), "
                             "not in the mutor block")
        for r in [self] + [self.for_method(n) for n in self.variants]:
            r._validate_mutor()          # now, with MuToRConfig's own messages

    @property
    def methods(self) -> list[str]:
        return list(self.method) if isinstance(self.method, (list, tuple)) else [self.method]

    def _validate_mutor(self) -> None:
        extra = {}
        if self.mutor.get("d_max_2d") is not None and self.mutor.get("grid_width") is None:
            extra["grid_width"] = self.mutor["d_max_2d"]     # the task sets the real grid width at run time
        self.mutor_config(**extra)

    def mutor_config(self, **overrides: Any) -> MuToRConfig:
        return MuToRConfig.from_dict({**self.mutor, "prefix_attention": self.prefix_attention, **overrides})

    def for_method(self, method: str) -> "Recipe":
        """This recipe for one method (or named variant: its method, with its settings merged in)."""
        r = copy.deepcopy(self)
        v = self.variants.get(method)
        r.method = method if v is None else v["method"]
        if v is not None:
            r.mutor = {**r.mutor, **v.get("mutor", {})}
            r.multi_token = {**r.multi_token, **v.get("multi_token", {})}
        r.variants = {}
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
        if cand.is_file():
            return cand
    shipped = sorted(str(f.relative_to(CONFIG_DIR).with_suffix("")) for f in CONFIG_DIR.rglob("*.yaml"))
    raise FileNotFoundError(f"no recipe {str(name_or_path)!r}: not a file, and not one of the shipped recipes "
                            f"{shipped}")


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ValueError(f"override {item!r} must look like key.sub=value")
    key, value = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"override {item!r}: bad key {key!r}")
    return key.split("."), yaml_load(value) if value != "" else None


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
        data = yaml_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a recipe must be a YAML mapping")
        name = path.stem
    data = apply_overrides(data, overrides)
    known = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"recipe: unknown key(s) {unknown}; known: {sorted(known)}")
    for blk in ("mutor", "multi_token", "data", "training", "model"):
        if blk in data and data[blk] is None:
            data[blk] = {}
    recipe = Recipe(**data)
    if recipe.name is None:
        recipe.name = name or "run"
    if recipe.source_dir is None and not isinstance(source, dict):
        recipe.source_dir = str(path.parent.resolve())
    return recipe
