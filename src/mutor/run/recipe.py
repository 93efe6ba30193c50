"""Recipes: one YAML file says everything a ``mutor train`` run depends on.

Besides ``method`` and ``seed`` (and run-wide scalars such as ``name``, ``threads``,
``prefix_attention``, ``grad_clip``) a recipe has six blocks: ``model``, ``mutor``, ``multi_token``,
``lora``, ``data`` and ``training``; ``variants`` names methods with their own settings. Each block
is read into the dataclass that consumes it (:mod:`mutor.run.arguments`: ``ModelArgs``,
``MuToRConfig`` / ``MultiTokenConfig``, ``peft.LoraConfig``, ``DataArguments``,
``MuToRTrainingArguments``), by the types ``transformers.HfArgumentParser`` gives their fields, so a
misspelt key (``training.max_stepz``) or a value of the wrong type (``training.max_steps=abc``) fails
before anything is loaded, in one line naming the key, the closest known key or the expected type,
and, for a key of the recipe file, the file and its line. A YAML syntax error names the file and
line too. All such errors are :class:`~mutor.utils.errors.MutorUserError`.

What is unusual: the :class:`Recipe` keeps each block as the mapping it was written as (checked, its
strings converted). That mapping is what ``recipe.yaml`` records, what a variant merges over, what
``--resume`` compares with the recorded run, and what :mod:`mutor.eval` reads back; the typed objects
come from it: :attr:`Recipe.model`, :meth:`Recipe.data_arguments`, :meth:`Recipe.training_arguments`,
:meth:`Recipe.method_config`.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from ..core.config import check_prefix_attention
from ..integrations.clipping import GRAD_CLIP_MODES, check_grad_clip
from ..methods.mutor import MuToRConfig
from ..methods.registry import get_method, method_names
from ..utils.errors import MutorUserError, did_you_mean
from ..utils.io import yaml_load
from .arguments import DataArguments, ModelArgs, RecipeKeyError, build_dataclass, check_keys, parse_block

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


CONFIG_DIR = Path(__file__).parents[1] / "configs"

# training keys with an obvious range, checked when the recipe is read (else the optimizer or Trainer refuses them
# after the model has loaded, in its own words): key -> (bound, whether the bound itself is allowed)
_TRAINING_BOUNDS = {"learning_rate": (0, False), "num_train_epochs": (0, True),
                    "per_device_train_batch_size": (1, True), "per_device_eval_batch_size": (1, True),
                    "gradient_accumulation_steps": (1, True), "warmup_steps": (0, True), "weight_decay": (0, True),
                    "max_grad_norm": (0, True), "logging_steps": (0, False), "save_steps": (0, False),
                    "eval_steps": (0, False)}

# the top-level keys whose types the recipe's own fields give (``method`` and ``model`` are read on their own)
_TOP_LEVEL = ("seed", "threads", "name", "loss_chunk_size", "prefix_attention", "grad_clip", "source_dir", "mutor",
              "multi_token", "variants", "lora", "data", "training")


@dataclass
class Recipe:
    """A training recipe, validated on construction (see the module docstring for its blocks).

    Each field's ``help`` metadata says what it takes; :func:`load_recipe` reads one from YAML with overrides.

    Raises:
        MutorUserError: An unknown key or a value of the wrong type (:class:`~mutor.run.arguments.RecipeKeyError`,
            naming it), or a value a block's class refuses.
    """

    method: Union[str, list[str]] = field(
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
        default=GRAD_CLIP_MODES[0], metadata={"help": "separate | joint: how training.max_grad_norm treats the "
                                                      "method's own parameters (register vector, Multi-Token heads), "
                                                      "for every method: MuToRTrainingArguments.grad_clip (see "
                                                      "training below)."})
    model: ModelArgs = field(default_factory=ModelArgs, metadata={"help": "The model to train (ModelArgs)."})
    mutor: dict = field(default_factory=dict, metadata={"help": "MuToRConfig fields (method mutor)."})
    multi_token: dict = field(default_factory=dict, metadata={"help": "MultiTokenConfig fields (method "
                                                                      "multi_token)."})
    variants: dict = field(default_factory=dict, metadata={
        "help": "Named methods with their own settings, usable in `method`: {mutor_2d: {method: mutor, mutor: "
                "{d_max_2d: 4}}} (keys: method, mutor, multi_token)."})
    lora: Optional[dict] = field(default=None, metadata={"help": "peft.LoraConfig fields; None: full fine-tuning."})
    data: dict = field(default_factory=dict, metadata={"help": "DataArguments fields (`task`, `packing`, "
                                                               "`truncate_to_model`) and the task's own options."})
    training: dict = field(default_factory=dict, metadata={"help": "MuToRTrainingArguments fields: "
                                                                   "transformers.TrainingArguments' and mutor's."})

    source_dir: Optional[str] = field(
        default=None, metadata={"help": "Directory of the recipe file (set when loaded): relative data paths that "
                                        "do not exist from the working directory are looked up there."})

    def __post_init__(self) -> None:
        for k, v in parse_block({k: getattr(self, k) for k in _TOP_LEVEL}, Recipe, "").items():
            setattr(self, k, v)
        if isinstance(self.model, dict):
            self.model = build_dataclass(ModelArgs, parse_block(self.model, ModelArgs, "model"))
        self._check_methods()
        self._check_values()
        self.data = self._checked_data()
        self.training = self._checked_training()
        if self.lora is not None:
            self.lora = self._checked_lora()
        self._check_method_blocks()

    # ----------------------------------------------------------------- checks
    def _check_methods(self) -> None:
        """``method`` names registered methods or variants, once each; each variant is a new name for a method."""
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

    def _check_values(self) -> None:
        """The top-level values in range (their types are checked already)."""
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"recipe threads must be a positive integer or null (got {self.threads!r})")
        if self.loss_chunk_size is not None and self.loss_chunk_size < 1:
            raise MutorUserError(f"recipe loss_chunk_size must be a positive integer or null "
                                 f"(got {self.loss_chunk_size!r})")
        check_prefix_attention(self.prefix_attention, "recipe prefix_attention")
        try:
            check_grad_clip(self.grad_clip)
        except ValueError as err:
            raise MutorUserError(f"recipe {err}") from None

    def _checked_data(self) -> dict:
        """The data block with its run keys checked (:class:`DataArguments`); the task checks its own options."""
        from .lengths import check_truncate_option

        if "task" not in self.data:
            raise MutorUserError("recipe data needs a `task` (e.g. data: {task: gsm8k})")
        check_truncate_option(self.data)
        run_keys = {f.name for f in dataclasses.fields(DataArguments) if f.init}
        return {**self.data, **parse_block({k: v for k, v in self.data.items() if k in run_keys}, DataArguments,
                                           "data")}

    def _checked_training(self) -> dict:
        from ..integrations.trainer import MuToRTrainingArguments

        if "grad_clip" in self.training:
            raise RecipeKeyError("training.grad_clip", "recipe training.grad_clip: set grad_clip at the top of the "
                                                       "recipe (it applies to every method)")
        training = parse_block(self.training, MuToRTrainingArguments, "training")
        for key, (low, inclusive) in _TRAINING_BOUNDS.items():
            value = training.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    not (value >= low if inclusive else value > low):
                raise RecipeKeyError(f"training.{key}", f"recipe training.{key}: must be {'>=' if inclusive else '>'} "
                                                        f"{low}, got {value!r}")
        return training

    def _checked_lora(self) -> dict:
        try:
            from peft import LoraConfig
        except ImportError:  # pragma: no cover
            raise MutorUserError("recipe lora needs peft: pip install -e '.[peft]' in the mutor checkout") from None
        lora = parse_block(self.lora, LoraConfig, "lora")
        try:
            LoraConfig(**{"task_type": "CAUSAL_LM", **lora})
        except (TypeError, ValueError) as err:
            raise MutorUserError(f"recipe lora: {err}") from None
        return lora

    def _check_method_blocks(self) -> None:
        """Each method block, the recipe's and each variant's: its keys and types, then its config class's checks
        on the options each method runs with."""
        specs = [get_method(name) for name in method_names() if get_method(name).recipe_block is not None]
        for spec in specs:
            block = spec.recipe_block
            setattr(self, block, self._checked_method_block(getattr(self, block), spec.config_class, block))
            for v_name, v in self.variants.items():
                if block in v:
                    v[block] = self._checked_method_block(v[block], spec.config_class, f"variants.{v_name}.{block}")
        for r in [self] + [self.for_method(n) for n in self.variants]:
            for spec in specs:
                try:
                    r.method_config(spec.name)
                except (TypeError, ValueError) as err:
                    raise MutorUserError(f"recipe {spec.recipe_block}: {err}") from None

    def _checked_method_block(self, values: Any, config_class: type, where: str) -> dict:
        if not isinstance(values, dict):
            raise RecipeKeyError(where, f"recipe {where}: expected a mapping, got {values!r}")
        if values.get("prefix_attention", self.prefix_attention) != self.prefix_attention:
            raise MutorUserError("set prefix_attention at the top of the recipe (it applies to every method), "
                                 f"not in the {where} block")
        return parse_block(values, config_class, where)

    # ------------------------------------------------------------ typed views
    @property
    def methods(self) -> list[str]:
        """The methods the recipe trains, as a list (``method`` may be one name or several)."""
        return list(self.method) if isinstance(self.method, (list, tuple)) else [self.method]

    def method_config(self, method: str, task_settings: Optional[dict] = None):
        """The typed config of ``method`` (registered name, not a variant: see :meth:`for_method`): the options in
        its recipe block, the run-wide ``prefix_attention`` and what the task decides (``task_settings``, e.g. an
        image task's grid; None before the task is built: :meth:`~mutor.core.config.JsonConfig.task_fields`)."""
        spec = get_method(method)
        options = getattr(self, spec.recipe_block) if spec.recipe_block else {}
        return spec.config(options, self.prefix_attention, **spec.config_class.task_fields(options, task_settings))

    def data_arguments(self) -> DataArguments:
        """The ``data`` block, typed.

        Returns:
            Its :class:`~mutor.run.arguments.DataArguments`, the task's own options in ``options``.
        """
        return DataArguments.from_block(self.data)

    def training_arguments(self, output_dir: Union[str, Path]):
        """The ``training`` block, typed, over mutor's defaults, with the recipe's ``seed`` and ``grad_clip``. A recipe
        with held-out rows (``data.eval_path`` or ``data.eval_split``) and no ``training.eval_strategy`` evaluates them
        as often as it saves checkpoints (else as often as it logs): :meth:`held_out_notice` says so.

        Args:
            output_dir: Where the method's run writes (``training.output_dir`` is the whole run's).

        Returns:
            Its :class:`~mutor.integrations.trainer.MuToRTrainingArguments`.

        Raises:
            MutorUserError: ``TrainingArguments`` refuses a value (its own message).
        """
        from .build import training_arguments

        args = training_arguments(self.training, self.seed, Path(output_dir), grad_clip=self.grad_clip)
        cadence = self._held_out_cadence(args)
        if cadence:
            args = training_arguments({**self.training, **cadence}, self.seed, Path(output_dir),
                                      grad_clip=self.grad_clip)
        return args

    def _held_out_cadence(self, args) -> dict:
        """What turns on the held-out evaluation of a recipe that names held-out rows (``data.eval_path`` or
        ``data.eval_split``) but no ``training.eval_strategy``: the checkpoints' cadence (``save_strategy``,
        ``save_steps``), else the logging one; ``{}`` when the recipe names no held-out rows or sets
        ``eval_strategy`` itself (``no`` included)."""
        if "eval_strategy" in self.training or all(self.data.get(k) is None for k in ("eval_path", "eval_split")):
            return {}
        for strategy, steps in ((args.save_strategy, args.save_steps), (args.logging_strategy, args.logging_steps)):
            value = getattr(strategy, "value", strategy)
            if value in ("steps", "epoch"):
                own_steps = value != "steps" or "eval_steps" in self.training
                return {"eval_strategy": value, **({} if own_steps else {"eval_steps": steps})}
        return {}

    def held_out_notice(self, args) -> Optional[str]:
        """The line ``mutor train`` prints when it turned the held-out evaluation on (:meth:`training_arguments`
        with held-out rows and no ``training.eval_strategy``); None otherwise.

        Args:
            args: The method's training arguments, from :meth:`training_arguments`.
        """
        if not self._held_out_cadence(args):
            return None
        key = "data.eval_path" if self.data.get("eval_path") is not None else "data.eval_split"
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
        steps = args.eval_steps if args.eval_steps is not None else args.logging_steps
        every = "every epoch" if strategy != "steps" else "every step" if steps == 1 else f"every {steps:g} steps"
        saving = getattr(args.save_strategy, "value", args.save_strategy) in ("steps", "epoch")
        why = "" if "eval_steps" in self.training else ", as checkpoints are saved" if saving else ", as training logs"
        return (f"{key} is set and training.eval_strategy is not: evaluating the held-out rows {every}{why} "
                f"(training.eval_strategy: {strategy}); set training.eval_strategy: no to train without")

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
        """The recipe as a plain dict, one key per field."""
        d = dataclasses.asdict(self)
        return d

    def to_yaml(self) -> str:
        """The recipe as YAML, fields in declaration order (what a run's ``recipe.yaml`` holds)."""
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
        launch_config = CONFIG_DIR / p.with_suffix(".yaml")
        raise FileNotFoundError(f"{str(name_or_path)!r} is an accelerate launch config, not a recipe: use it as "
                                f"`accelerate launch --config_file {launch_config} -m mutor train RECIPE`")
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


def _key_lines(text: str) -> dict[str, int]:
    """Each key of a YAML document, dotted (``training.max_steps``), and the line it is on (1-based)."""
    out: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}{k.value}"
                out[key] = k.start_mark.line + 1
                walk(v, key + ".")

    walk(yaml.compose(text, Loader=yaml.SafeLoader), "")
    return out


def _located(err: RecipeKeyError, origins: dict[str, Optional[str]]) -> RecipeKeyError:
    """``err`` prefixed with the file and line of its key (or of the nearest block above it) when the recipe file
    gave it; a key of the command line's overrides is named by the message itself."""
    parts = err.key.split(".")
    keys = [k for k in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if k in origins]
    where = origins[keys[0]] if keys else None
    return err if where is None else RecipeKeyError(err.key, f"{where}: {err}")


def load_recipe(source: Union[str, Path, dict], overrides: Optional[list[str]] = None) -> Recipe:
    """Read a recipe (file, shipped name, or dict), apply overrides, validate.

    Args:
        source: A recipe file, the name of a shipped recipe (``tiny/gsm8k``), or the recipe as a dict.
        overrides: ``dotted.key=value`` items, values parsed as YAML.

    Returns:
        The recipe, every block checked.

    Raises:
        MutorUserError: A bad key or value, named; for a key of the recipe file with its file and line.
        FileNotFoundError: No such recipe.
    """
    origins: dict[str, Optional[str]] = {}       # dotted key -> "FILE: line N" (None: set by an override)
    if isinstance(source, dict):
        data, name = copy.deepcopy(source), None
    else:
        path = find_recipe(source)
        text = path.read_text()
        data = yaml_load(text, str(path)) or {}
        if not isinstance(data, dict):
            raise MutorUserError(f"{path}: a recipe must be a YAML mapping")
        name = path.stem
        origins = {k: f"{path}: line {n}" for k, n in _key_lines(text).items()}
    data = apply_overrides(data, overrides)
    for item in overrides or []:                 # an override replaces what the file says at and under its key
        key = item.split("=", 1)[0]
        origins = {k: v for k, v in origins.items() if not k.startswith(key + ".")}
        origins[key] = None
    try:
        check_keys(data, Recipe, "")
        for blk in (*method_blocks(), "data", "training", "model"):
            if blk in data and data[blk] is None:
                data[blk] = {}
        recipe = Recipe(**data)
    except RecipeKeyError as err:
        raise _located(err, origins) from None
    if recipe.name is None:
        recipe.name = name or "run"
    if recipe.source_dir is None and not isinstance(source, dict):
        recipe.source_dir = str(path.parent.resolve())
    return recipe
