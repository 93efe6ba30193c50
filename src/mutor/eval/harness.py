"""``mutor eval``: generate on a benchmark split, score every answer, and pick checkpoints as the paper does.

Benchmarks are table-driven (:mod:`mutor.eval.benchmarks`: :data:`BENCHMARKS`, keyed by ``--task`` name,
each a template from :mod:`mutor.data.templates` and a scorer); add one with :func:`register_benchmark`.

Checkpoint selection (``--checkpoints RUN_DIR``) follows the paper: where the task has a
validation split (AQUA-RAT, SAMSum, DialogSum) every ``checkpoint-*`` is scored on validation,
the best one (accuracy, or ROUGE-L) is then scored on test and reported; for GSM8K and MATH500,
which have no validation split, every checkpoint is scored on test and the best test score is
reported, which is the paper's protocol (an optimistic one, and the summary says so).

Outputs, written atomically: ``generations.jsonl`` (prompt, generation, reference, extracted
answer, verdict or ROUGE per example), ``summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import statistics
from pathlib import Path
from typing import Callable, Optional, Union

from ..methods.registry import method_of_run
from ..utils.io import write_json_atomic, write_jsonl_atomic, write_text_atomic
from .benchmarks import BENCHMARKS, Benchmark, benchmark_for, get_benchmark, register_benchmark

__all__ = ["Benchmark", "BENCHMARKS", "register_benchmark", "get_benchmark", "evaluate_model",
           "evaluate_checkpoints"]


# ----------------------------------------------------------------- loading
def check_model_path(path: str, flag: str = "--model", needs_run: Optional[str] = None) -> None:
    """Refuse a model or run path that is not there, naming it, before anything else is read.

    A name that cannot be a Hub id (it starts with ``.``, ``/`` or ``~``, or has more than one ``/``) must be a
    local path, and so must a ``--checkpoints`` run; so must any name when ``needs_run`` says why only a run
    will do (its recipe names the rows to score).

    Args:
        path: What the user gave.
        flag: How the user gave it (``--model``, ``--checkpoints``).
        needs_run: Why a Hub id will not do here, or None where one may.

    Raises:
        FileNotFoundError: ``path`` does not exist, named with ``flag``.
    """
    name = str(path)
    if Path(name).expanduser().exists():
        return
    if flag == "--checkpoints" or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"{flag} {name!r} does not exist")
    if needs_run:
        raise FileNotFoundError(f"{flag} {name!r} does not exist: no such directory ({needs_run})")


def run_needed(task_name: str, data: Optional[str]) -> Optional[str]:
    """Why ``mutor eval --task task_name`` (``data``: its ``--data``) needs a local run rather than a Hub id, for
    :func:`check_model_path`; None where a Hub id will do."""
    if task_name == "run":
        return "--task run rebuilds the task from the run's recipe.yaml"
    own = task_name in BENCHMARKS and BENCHMARKS[task_name].for_run is not None
    return "only a run's recipe names the rows to score; give --data FILE to score a Hub model" \
        if own and data is None else None


def load_model_and_tokenizer(path: str, tokenizer: Optional[str] = None, dtype: str = "auto",
                             device: Optional[str] = None):
    """The model (a peft adapter directory merged) in ``dtype`` on ``device`` (default: a GPU when there is
    one; see :mod:`mutor.utils.devices`), and its tokenizer with a pad token."""
    from transformers import AutoTokenizer

    from ..models.loading import from_pretrained, load_causal_lm, load_peft_model, resolve_dtype
    from ..utils.devices import resolve_device

    p = Path(path)
    if (p / "adapter_config.json").is_file():     # on its recorded base (a LoRA run's saved random init too)
        model = load_peft_model(p, dtype=resolve_dtype(dtype)).merge_and_unload()
        model = model.to(resolve_device(device)).eval()
    else:
        model = from_pretrained(lambda name, **kw: load_causal_lm(name, device, dtype), str(p), "--model")
    tok = from_pretrained(AutoTokenizer.from_pretrained, tokenizer or str(p), "tokenizer", is_model=False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def load_drafter(path: str, tokenizer: Optional[str] = None, dtype: str = "auto", device: Optional[str] = None):
    """A MuToR checkpoint whose registers draft (:mod:`mutor.generation`): its model (a LoRA adapter
    merged, :func:`load_model_and_tokenizer`) wrapped with its sidecar, in eval mode, and its tokenizer."""
    from ..methods.mutor import MuToRModel

    if not (Path(path) / MuToRModel.config_file).is_file():
        raise ValueError(f"drafting needs a MuToR checkpoint (model + mutor sidecar); {path} has no "
                         f"{MuToRModel.config_file}")
    base, tok = load_model_and_tokenizer(path, tokenizer, dtype=dtype, device=device)
    return MuToRModel.from_pretrained(path, base=base).to(base.device).eval(), tok


def task_prompts(task_name: str, tok, split: str = "test", data: Optional[str] = None, limit: Optional[int] = None,
                 model_path: Optional[str] = None) -> tuple[list[list[int]], Benchmark]:
    """The token ids of a benchmark split's prompts, as ``mutor eval`` feeds them, and the benchmark."""
    benchmark = benchmark_for(task_name, model_path)
    examples = load_examples(benchmark, split, data, limit, model_path=model_path)
    return [tok(benchmark.prompt(ex, tok), add_special_tokens=benchmark.add_special_tokens)["input_ids"]
            for ex in examples], benchmark


def run_info(path: str) -> dict:
    """``method``, ``seed``, ``prefix_attention`` of the run a model directory came from (recipe / sidecar)."""
    from ..utils.io import yaml_load

    info: dict = {}
    p = Path(path)
    for d in (p, p.parent):
        recipe = d / "recipe.yaml"
        if recipe.is_file():
            data = yaml_load(recipe.read_text(), str(recipe)) or {}
            for k in ("method", "seed", "prefix_attention", "name"):
                if k in data and k not in info:
                    info[k] = data[k]
    method = method_of_run(p)                     # the sidecar a wrapper's checkpoint holds, if any
    if method is not None and "prefix_attention" not in info:
        sidecar = p / method.wrapper_class.config_file
        info["prefix_attention"] = json.loads(sidecar.read_text()).get("prefix_attention", "causal")
    return info


def load_examples(benchmark: Benchmark, split: str, data: Optional[str] = None, limit: Optional[int] = None,
                  model_path: Optional[str] = None, what: str = "--data") -> list[dict]:
    """The rows of ``split`` (or of the file ``data``, which the user named ``what``) the benchmark scores."""
    from ..data.text import load_rows

    if benchmark.rows is not None:                # own data: the run's files, or --data, checked
        return benchmark.rows(split, data, limit, what)
    if data is None and benchmark.examples is not None:
        return benchmark.examples(split, limit, model_path)
    template = benchmark.template
    hub_split = template.splits.get(split)
    if data is None and hub_split is None:
        raise ValueError(f"{template.name} has no {split!r} split on the Hub; give --data (a local file)")
    rows = load_rows(data, template.hub_id, template.hub_config, hub_split, what=what)
    if limit is not None:
        rows = rows.select(range(min(int(limit), len(rows))))
    return [dict(r) for r in rows]


# -------------------------------------------------------------- evaluation
def evaluate_model(task_name: str, model_path: str, split: str = "test", data: Optional[str] = None,
                   limit: Optional[int] = None, batch_size: int = 8, output_dir: Optional[str] = None,
                   prefix_attention: Optional[str] = None, max_new_tokens: Optional[int] = None,
                   tokenizer: Optional[str] = None, progress: bool = True, model_and_tokenizer=None,
                   device: Optional[str] = None, dtype: str = "auto", draft_registers: Optional[Union[int, str]] = None,
                   decode: Optional[Callable] = None, scorer: Optional[str] = None, data_label: str = "--data") -> dict:
    """Score one model on one split; returns the summary (also written to ``output_dir``).

    The model is loaded in ``dtype`` on ``device`` (default: a GPU when there is one) unless
    ``model_and_tokenizer`` gives it, already placed. ``draft_registers`` K or ``"auto"``: decode one example at a
    time with the run's registers drafting offsets 2..K (``"auto"``: a draft length per step, for speed;
    :mod:`mutor.generation`, the same tokens as greedy decoding), and record the drafting statistics in the
    summary. ``decode(prompt_ids, max_new_tokens, eos_id)`` replaces batched greedy decoding. ``scorer``
    (``module:function``, :func:`~mutor.eval.benchmarks.load_scorer`) replaces the benchmark's metric;
    ``data_label`` is how errors name ``data`` (``--data``, ``--val-data``).

    Own-data tasks (``prompt_completion``, ``chat``) render prompts with the run's own templates, read from the
    ``recipe.yaml`` of the run ``model_path`` belongs to, and score its ``data.eval_path`` rows unless ``data``
    is given (its ``data.path`` rows when it names no held-out file, and the summary says so)."""
    from tqdm.auto import tqdm

    from ..data.text import row_name
    from ..utils.errors import MutorUserError
    from .generation import check_generation_fits, greedy_generate

    if model_and_tokenizer is None:
        check_model_path(model_path, needs_run=run_needed(task_name, data))
    benchmark = benchmark_for(task_name, str(model_path), scorer)     # the scorer is imported before any work
    if draft_registers is not None:
        return _evaluate_with_drafts(task_name, model_path, split, data, limit, output_dir, prefix_attention,
                                     max_new_tokens, tokenizer, progress, device, dtype, draft_registers, scorer,
                                     data_label)
    # local rows are read (and checked) before the model loads; a Hub split after, so that a missing model is
    # reported before a network error
    def load() -> list[dict]:
        return load_examples(benchmark, split, data, limit, model_path=str(model_path), what=data_label)

    examples = load() if data is not None or benchmark.rows is not None else None
    model, tok = model_and_tokenizer or load_model_and_tokenizer(model_path, tokenizer, dtype=dtype, device=device)
    if examples is None:
        examples = load()
    info = run_info(model_path)
    mode = prefix_attention or info.get("prefix_attention", "causal")
    template = benchmark.template
    prompts = [benchmark.prompt(ex, tok) for ex in examples]
    refs = [benchmark.reference(ex) for ex in examples]
    n_new = int(max_new_tokens or (_budget(tok, refs) if benchmark.budget_from_references else
                                   template.max_new_tokens))
    encoded = [tok(p, add_special_tokens=benchmark.add_special_tokens)["input_ids"] for p in prompts]
    check_generation_fits(model, max(map(len, encoded), default=0), n_new)     # before any batch is generated
    # batches of similar prompt lengths (less padding); rows are reported in the examples' order
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    gens: dict[int, list[int]] = {}
    bar = tqdm(total=len(prompts), desc=f"{task_name}/{split}", disable=not progress)
    for i in range(0, len(order), batch_size):
        chunk = order[i:i + batch_size]
        ids = [encoded[j] for j in chunk]
        out = decode(ids, n_new, tok.eos_token_id) if decode is not None else greedy_generate(
            model, ids, n_new, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, prefix_attention=mode)
        gens.update(zip(chunk, out))
        bar.update(len(chunk))
    bar.close()
    rows = []
    for j, (ex, prompt, ref) in enumerate(zip(examples, prompts, refs)):
        text = tok.decode(gens[j], skip_special_tokens=True)
        where = data or benchmark.sources.get(split) or split
        try:
            scores = benchmark.score_row(text, ref, ex)
        except Exception as err:
            if benchmark.scorer is None:
                raise
            raise MutorUserError(f"--scorer {benchmark.scorer!r} failed on {row_name(j, where)} of {where}: "
                                 f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
        bad = [k for k, v in scores.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad and benchmark.scorer is not None:      # JSON has no NaN: refused, not written as a bare NaN
            raise MutorUserError(f"--scorer {benchmark.scorer!r} returned {scores[bad[0]]} for {bad[0]!r} on "
                                 f"{row_name(j, where)} of {where}; a metric must be a finite number")
        rows.append({"prompt": prompt, "generation": text, "reference": ref,
                     "extracted": benchmark.extract(text), **scores})
    fixed = ("prompt", "generation", "reference", "extracted")
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in fixed))
    # a second test split (gsm_symbolic's test_new_templates) is its own column in `mutor compare`
    label = task_name if split in ("test", "validation") else f"{task_name}:{split}"
    summary = {"task": label, "split": split, "model": str(model_path), "n": len(rows),
               "metrics": {k: statistics.fmean(r[k] for r in rows if k in r) for k in keys},
               "primary": benchmark.primary or (keys[0] if keys else ""),
               "prefix_attention": mode, "max_new_tokens": n_new,
               "data": data or benchmark.sources.get(split) or template.hub_id,
               **({"scorer": benchmark.scorer} if benchmark.scorer else {}),
               **({"note": benchmark.note} if benchmark.note and data is None else {}),
               **{k: info[k] for k in ("method", "seed") if k in info}}
    if output_dir is not None:
        out = Path(output_dir)
        write_jsonl_atomic(out / "generations.jsonl", rows)
        write_json_atomic(out / "summary.json", summary, allow_nan=False)
        write_text_atomic(out / "summary.md", summary_markdown([summary]))
    return summary


def _budget(tok, references: list[str]) -> int:
    """Own data's default ``max_new_tokens``: twice the longest reference's tokens with its eos, at least 16 (a
    generation much longer than every reference cannot match one)."""
    longest = max((len(tok(r, add_special_tokens=False)["input_ids"]) + 1 for r in references), default=0)
    return max(16, 2 * longest)


def _evaluate_with_drafts(task_name, model_path, split, data, limit, output_dir, prefix_attention, max_new_tokens,
                          tokenizer, progress, device, dtype, K, scorer=None, data_label="--data") -> dict:
    """``evaluate_model`` with registers as drafters (``K``: an integer or ``"auto"``): the MuToR checkpoint
    (base, a LoRA adapter merged into it, + sidecar), batch 1."""
    import time

    import torch

    from ..generation import DraftPolicy, DraftStats, generate

    drafter, tok = load_drafter(model_path, tokenizer, dtype=dtype, device=device)
    mode = prefix_attention or run_info(model_path).get("prefix_attention", "causal")
    total, seconds = DraftStats(), 0.0
    # one chooser for the whole split: what it learns about acceptance and cost carries over between prompts
    drafts = DraftPolicy(drafter.mutor_config.d_max) if K == "auto" else K

    def decode(prompts: list[list[int]], n_new: int, eos_id: Optional[int]) -> list[list[int]]:
        nonlocal seconds
        rows = []
        for p in prompts:
            t0 = time.perf_counter()
            out, st = generate(drafter, torch.tensor([p]), n_new, drafts, eos_token_id=[] if eos_id is None else eos_id,
                               prefix_attention=mode)
            seconds += time.perf_counter() - t0
            total.add(st)
            new = out[0, len(p):].tolist()
            rows.append(new[:new.index(eos_id)] if eos_id in new else new)
        return rows

    summary = evaluate_model(task_name, model_path, split, data, limit, batch_size=1, output_dir=output_dir,
                             prefix_attention=mode, max_new_tokens=max_new_tokens, progress=progress,
                             model_and_tokenizer=(drafter, tok), decode=decode, scorer=scorer,
                             data_label=data_label)
    summary["drafting"] = {"draft_registers": K, **total.to_dict(),
                           "tokens_per_s": round(total.new_tokens / max(seconds, 1e-9), 2)}
    if output_dir is not None:
        write_json_atomic(Path(output_dir) / "summary.json", summary, allow_nan=False)
    return summary


def summary_markdown(summaries: list[dict]) -> str:
    keys = sorted({k for s in summaries for k in s["metrics"]})
    lines = ["| model | task | split | n | " + " | ".join(keys) + " |", "|" + "---|" * (4 + len(keys))]
    for s in summaries:
        vals = [f"{s['metrics'][k]:.2f}" if k in s["metrics"] else "-" for k in keys]
        lines.append(f"| {s['model']} | {s['task']} | {s['split']} | {s['n']} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def list_checkpoints(run_dir: str) -> list[Path]:
    """A run's ``checkpoint-<step>`` directories in step order.

    A path that does not exist is named as ``--checkpoints`` in the error.
    """
    if not Path(run_dir).exists():
        raise FileNotFoundError(f"--checkpoints {str(run_dir)!r} does not exist")
    ck = [p for p in Path(run_dir).glob("checkpoint-*") if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)]
    if not ck:
        runs = sorted({d.parent.name for d in Path(run_dir).glob("*/checkpoint-*") if d.is_dir()}) \
            if Path(run_dir).is_dir() else []
        hint = f"; it holds the runs {runs}: give one of them, e.g. {Path(run_dir) / runs[0]}" if runs else ""
        raise FileNotFoundError(f"{run_dir} has no checkpoint-<step> directories{hint}")
    return sorted(ck, key=lambda p: int(p.name.split("-")[1]))


def evaluate_checkpoints(task_name: str, run_dir: str, data: Optional[str] = None, val_data: Optional[str] = None,
                         output_dir: Optional[str] = None, **kw) -> dict:
    """Every checkpoint of a run, selected the paper's way; returns the selection summary.

    Own data (``prompt_completion``, ``chat``): checkpoints are picked on validation rows (``val_data``, else the
    run's ``data.eval_path``) and the pick is reported on test rows (``data``, else the run's ``data.eval_path``);
    when both are the same rows, the best score on them is reported under the split they were picked on
    (``validation``), and the summary says it is optimistic. Every selection summary records
    ``selected_on_reported_rows``: whether the checkpoint is reported on the rows it was picked on."""
    check_model_path(run_dir, "--checkpoints")
    benchmark = benchmark_for(task_name, str(run_dir), kw.get("scorer"))
    out = Path(output_dir or Path(run_dir) / "eval" / task_name)
    cks = list_checkpoints(run_dir)
    earlier = _earlier_outputs(out)            # what an earlier selection wrote here, replaced once this one is done
    template = benchmark.template
    use_val = template.selection == "validation" and (template.has_split("validation") or val_data is not None)
    val_rows, test_rows = val_data or benchmark.sources.get("validation"), data or benchmark.sources.get("test")
    # own data whose validation rows are its test rows: pick on them once, name them validation (the split they
    # were picked on), and say that the report is optimistic
    same_rows = use_val and benchmark.rows is not None and val_rows is not None and val_rows == test_rows
    use_val = use_val and not same_rows
    from_val = use_val or (same_rows and val_data is not None)        # picked on the rows given as --val-data
    select_split = "validation" if use_val or same_rows else "test"
    scores, written = [], {out / ck.name / select_split for ck in cks}
    for ck in cks:
        s = evaluate_model(task_name, str(ck), split=select_split, data=val_data if from_val else data,
                           output_dir=str(out / ck.name / select_split),
                           **{"data_label": "--val-data" if from_val else "--data", **kw})
        scores.append((s["metrics"][s["primary"]], ck, s))
    primary = scores[0][2]["primary"]
    best_score, best, best_summary = max(scores, key=lambda x: x[0])
    written |= {out / x for split in benchmark.test_splits[1:] for x in (split, Path(best.name) / split)}
    written |= {out / best.name / "test"} if use_val else set()
    test = best_summary if not use_val else evaluate_model(task_name, str(best), split="test", data=data,
                                                           output_dir=str(out / best.name / "test"), **kw)
    if use_val:
        protocol = f"best of {len(cks)} checkpoints by validation {primary}, reported on test"
    elif benchmark.rows is not None:
        protocol = (f"best {select_split} {primary} over {len(cks)} checkpoints, picked on the rows it reports "
                    f"({test_rows}; "
                    "give --val-data, or --data for test rows apart from the run's held-out rows, to pick on "
                    "other rows); optimistic by construction")
    else:
        protocol = (f"best test {primary} over {len(cks)} checkpoints (the paper's protocol for {task_name}, "
                    "which has no validation split; optimistic by construction)")
    result = {**test, "model": str(best), "run_dir": str(run_dir), "selected_checkpoint": best.name,
              "selection": protocol, "selection_split": select_split,
              "selected_on_reported_rows": not use_val or (val_data is not None and val_data == data),
              "per_checkpoint": [{"checkpoint": c.name, primary: v} for v, c, _ in scores]}
    result.update({k: v for k, v in run_info(str(best)).items() if k in ("method", "seed")})
    write_json_atomic(out / "summary.json", result, allow_nan=False)
    write_text_atomic(out / "summary.md", summary_markdown([result]) + f"\n{protocol}; selected {best.name}.\n")
    for split in benchmark.test_splits[1:]:       # the same selected checkpoint on the task's other test splits,
        other_out = out / split                   # inside the output directory as `--model` writes its splits
        other = evaluate_model(task_name, str(best), split=split, data=None,
                               output_dir=str(out / best.name / split), **kw)
        other = {**other, "model": str(best), "run_dir": str(run_dir), "selected_checkpoint": best.name,
                 "selection": protocol, "selection_split": select_split, "selected_on_reported_rows": False}
        other.update({k: v for k, v in run_info(str(best)).items() if k in ("method", "seed")})
        write_json_atomic(other_out / "summary.json", other, allow_nan=False)
        write_text_atomic(other_out / "summary.md", summary_markdown([other]) + f"\n{protocol}; selected "
                                                                                 f"{best.name}.\n")
        result.setdefault("other_splits", {})[split] = {"n": other["n"], "metrics": other["metrics"],
                                                        "summary": str(other_out / "summary.json")}
        write_json_atomic(out / "summary.json", result, allow_nan=False)
    _remove_outputs_not_rewritten(out, earlier, written)
    return result


_EVAL_FILES = ("summary.json", "summary.md", "generations.jsonl")     # what an evaluation writes to its directory


def _earlier_outputs(out: Path) -> set[Path]:
    """The evaluation directories already inside a selection's output directory ``out`` (``checkpoint-N/<split>/``
    and ``<split>/``): only those whose ``summary.json`` is an evaluation summary, so that what the user put there
    is never among them."""
    found: set[Path] = set()
    for summary in [*out.glob("*/summary.json"), *out.glob("checkpoint-*/*/summary.json")]:
        try:
            s = json.loads(summary.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(s, dict) and {"task", "metrics", "model"} <= set(s):
            found.add(summary.parent)
    return found


def _remove_outputs_not_rewritten(out: Path, earlier: set[Path], written: set[Path]) -> None:
    """After a selection finished: remove the evaluation files of the earlier directories (:func:`_earlier_outputs`)
    that this selection did not write again, and the directories they leave empty, so that ``out`` holds this
    selection's outputs only (``mutor compare`` reads every summary under it). ``written``: the directories this
    selection wrote."""
    for d in sorted(earlier - written, key=lambda p: len(p.parts), reverse=True):
        for name in _EVAL_FILES:
            (d / name).unlink(missing_ok=True)
        for x in (d, d.parent):
            if x != out and x.is_dir() and not any(x.iterdir()):
                x.rmdir()


# ------------------------------------------------------- synthetic tasks
def evaluate_run_task(model_path: str, output_dir: Optional[str] = None, overrides: Optional[dict] = None,
                      device: Optional[str] = None, dtype: str = "auto", source: Optional[str] = None) -> dict:
    """Evaluate a model on the synthetic task it was trained on (star graphs, digits, ...).

    The task and its options come from the run's ``recipe.yaml`` (in the model directory or its
    parent), so held-out data and metrics are exactly those of training; ``overrides`` changes
    task options (e.g. ``{"num_test": 2000}``). The model is loaded in ``dtype`` on ``device`` (default: a
    GPU when there is one).
    """
    from ..data.registry import build_training_data
    from ..utils.io import yaml_load

    check_model_path(model_path, needs_run=run_needed("run", None))
    p = Path(model_path)
    recipe = next((d / "recipe.yaml" for d in (p, p.parent) if (d / "recipe.yaml").is_file()), None)
    if recipe is None:
        raise FileNotFoundError(f"{model_path}: no recipe.yaml here or in the parent; synthetic tasks are evaluated "
                                "on the data their run was trained with")
    r = yaml_load(recipe.read_text(), str(recipe))
    data = dict(r.get("data") or {})
    name = data.pop("task")
    data.pop("packing", None)
    data.pop("truncate_to_model", None)            # run options, not the task's
    from ..data.templates import TEMPLATES
    from ..models.loading import from_pretrained
    from ..utils.errors import MutorUserError

    if name in TEMPLATES or name in BENCHMARKS or name in ("text", "prompt_completion"):
        use = f"--task {name}" if name in BENCHMARKS else f"--task with one of {sorted(BENCHMARKS)}"
        raise MutorUserError(f"{model_path} is a run of the text task {name!r}, not of a synthetic task "
                             f"(--task run is for star_graph, digits, image_codes): use {use}")
    tokenizer = None
    if data.get("render") == "text":              # graphs as text: the run's own tokenizer renders them
        from transformers import AutoTokenizer

        tokenizer = from_pretrained(AutoTokenizer.from_pretrained, str(p), "tokenizer", is_model=False)
    training_data = build_training_data(name, {**data, **(overrides or {})}, tokenizer, int(r.get("seed", 0)))
    if training_data.evaluator is None:
        raise ValueError(f"task {name!r} has no evaluator; use one of {sorted(BENCHMARKS)} for text benchmarks")
    if source is not None:                 # test graphs from an independent generator, same evaluator
        training_data = _with_source(training_data, name, source, {**data, **(overrides or {})})
    from ..image.rotary2d import apply_saved_rotary_2d
    from ..models.loading import load_causal_lm

    model = from_pretrained(lambda name, **kw: load_causal_lm(name, device, dtype), str(p), "--model")
    apply_saved_rotary_2d(model, p)
    import torch

    # an evaluator that can (star graphs) also gives one record per example: generations.jsonl, as for text tasks
    records = [] if "records" in inspect.signature(training_data.evaluator).parameters else None
    with torch.no_grad():
        metrics = training_data.evaluator(model, 0, **({} if records is None else {"records": records}))
    summary = {"task": name if source is None else f"{name}:{source}", "split": "test", "model": str(model_path),
               "n": metrics.get("num_eval"), **({"source": source} if source else {}),
               "metrics": metrics, "primary": training_data.primary_metric or next(iter(metrics)),
               **{k: r[k] for k in ("method", "seed") if k in r}}
    if output_dir is not None:
        if records is not None:
            write_jsonl_atomic(Path(output_dir) / "generations.jsonl", records)
        write_json_atomic(Path(output_dir) / "summary.json", summary)
        write_text_atomic(Path(output_dir) / "summary.md", summary_markdown([summary]))
    return summary


def _with_source(training_data, name: str, source: str, options: dict):
    """``training_data`` with its held-out set replaced by ``source``'s graphs (``path_star``: reasoning-gym's),
    in the run's graph shape and labels, none of them a training problem; the evaluator is the task's own."""
    import dataclasses

    from ..utils.errors import MutorUserError

    if source != "path_star" or name != "star_graph":
        raise MutorUserError(f"--source {source!r}: only 'path_star' (reasoning-gym's graphs) for star_graph runs "
                             f"(this run's task is {name!r})")
    from ..data.path_star import path_star_examples
    from ..data.star_graph import StarGraphShape

    shape = StarGraphShape.from_options(options)
    train_keys = {ex.key for ex in training_data.train_dataset.examples}
    examples = path_star_examples(shape, int(options.get("num_test", 500)), seed=0,
                                  exclude=train_keys)
    batch_size = int(options.get("eval_batch_size", 64 if options.get("render") == "text" else 256))
    return dataclasses.replace(training_data,
                               evaluator=training_data.train_dataset.evaluator_for(examples, batch_size),
                               info={**training_data.info, "source": source, "num_test": len(examples)})
