"""``mutor eval`` and ``mutor compare``: arguments, and which splits go to which output directory; the
evaluation itself lives in :mod:`mutor.eval`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub) -> None:
    """Add the ``mutor eval`` and ``mutor compare`` subparsers to ``sub``."""
    from ..core.config import PREFIX_ATTENTION
    from ..eval.benchmarks import BENCHMARKS
    from ..models.loading import DTYPES

    p = sub.add_parser("eval", help="generate and score a benchmark (the paper's protocol)",
                       description="Greedy decoding with the training prompt template, then the paper's metric. "
                                   "With --checkpoints, every checkpoint-* of a run is scored and the best one is "
                                   "picked on validation (AQUA-RAT, SAMSum, DialogSum) or test (GSM8K, MATH500).")
    p.add_argument("--task", required=True,
                   help=f"a text benchmark ({', '.join(sorted(BENCHMARKS))}) or 'run' for the synthetic task a "
                        "model was trained on (star_graph, digits: read from the run's recipe.yaml); "
                        "prompt_completion and chat score your own data with the run's own templates and files "
                        "(its recipe.yaml), by exact match after whitespace normalisation unless --scorer")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model directory or Hub id (a peft adapter directory is merged)")
    src.add_argument("--checkpoints", help="run directory with checkpoint-<step> subdirectories")
    p.add_argument("--source", default=None, choices=["path_star"],
                   help="with --task run on a star_graph run: held-out graphs from reasoning-gym's path_star "
                        "generator (an independent source), mapped onto the run's labels and layout")
    p.add_argument("--split", default=None, choices=["test", "validation", "test_new_templates"],
                   help="with --model (default: the task's test split(s); gsm_symbolic has two: test, new instances "
                        "of the training templates, and test_new_templates, templates never trained on)")
    p.add_argument("--data", default=None, help="local JSONL/Parquet file instead of the Hub split (own data: "
                                                 "instead of the run's data.eval_path)")
    p.add_argument("--val-data", default=None, help="with --checkpoints: local validation file (own data: default "
                                                     "the run's data.eval_path)")
    p.add_argument("--scorer", default=None, metavar="MODULE:FUNCTION",
                   help="your metric instead of the task's: fn(prediction: str, reference: str, row: dict) -> "
                        "float | bool | dict, called per example (a bool counts 100 or 0; a dict is one metric per "
                        "key, the first ranks checkpoints); MODULE importable from the working directory or "
                        "PYTHONPATH, or a path/to/file.py")
    p.add_argument("--limit", type=int, default=None, help="first N examples only (smoke runs)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="prompts decoded together in batched greedy decoding (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's budget")
    p.add_argument("--prefix-attention", choices=PREFIX_ATTENTION, default=None,
                   help="default: what the run was trained with (recipe.yaml / mutor_config.json), else causal")
    p.add_argument("--tokenizer", default=None, help="default: the model directory's tokenizer")
    p.add_argument("--device", default=None, help="torch device to evaluate on (default: cuda when a GPU is "
                                                 "visible, else cpu)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="dtype to load the model in (default: the "
                                                                   "checkpoint's own)")
    p.add_argument("--draft-registers", default=None, metavar="K|auto",
                   help="with --model (a MuToR checkpoint): decode with the trained registers as drafters "
                        "(lossless greedy self-speculative decoding, batch 1): 'auto' picks each step's draft "
                        "length for the most tokens/s (plain greedy when drafts do not pay), an integer K always "
                        "drafts offsets 2..K; the summary records acceptance per offset, tokens per forward and "
                        "tokens/s. Decodes one prompt at a time: it cuts one request's latency; to score a whole "
                        "split, batched greedy decoding (--batch-size, without this flag) is faster")
    p.add_argument("--output-dir", default=None, help="default: <model>/eval/<task>-<split> or <run>/eval/<task>")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars, and the summary is not printed (it is still written)")
    p.set_defaults(command="eval")

    c = sub.add_parser("compare", help="paper-style table (method x task) from saved evaluation summaries",
                       description="Reads summary.json files (or directories holding them); runs that differ only "
                                   "in seed are averaged (mean ± sample std).")
    c.add_argument("paths", nargs="+", help="summary.json files or directories")
    c.add_argument("--output", default=None, help="also write the table to this Markdown file")
    c.add_argument("--metrics", nargs="+", default=None,
                   help="metric columns (default: each task's primary metric), e.g. fd precision recall")
    c.add_argument("--plot", default=None, help="also draw the metrics per method to this PNG")
    c.set_defaults(command="compare")


def run(args: argparse.Namespace) -> int:
    """Run ``mutor eval`` or ``mutor compare`` on parsed ``args``; return the exit status."""
    if args.command == "compare":
        return _compare(args)
    if not args.quiet:
        return _run_eval(args)
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()             # --quiet: no "Loading weights" bar either
    try:
        return _run_eval(args)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _run_eval(args: argparse.Namespace) -> int:
    from ..eval.harness import check_model_path, run_needed

    if args.checkpoints is not None:               # a path that is not there, before anything is read
        check_model_path(args.checkpoints, "--checkpoints")
    else:
        check_model_path(args.model, needs_run=run_needed(args.task, args.data))
    if args.task == "run":
        if args.scorer:
            raise SystemExit("mutor eval: --scorer scores text tasks' generations; --task run uses its task's own "
                             "evaluator")
        return _eval_run_task(args)
    from ..eval.benchmarks import BENCHMARKS
    from ..eval.harness import evaluate_checkpoints

    if args.task not in BENCHMARKS:
        raise SystemExit(f"mutor eval: unknown task {args.task!r}; text tasks: {sorted(BENCHMARKS)}, or 'run'")
    common = _eval_options(args)
    if args.checkpoints:
        result = evaluate_checkpoints(args.task, args.checkpoints, data=args.data, val_data=args.val_data,
                                      output_dir=args.output_dir, **common)
    else:
        result = _eval_model(args, common)
    if not args.quiet:
        print(json.dumps({k: v for k, v in result.items() if k != "per_checkpoint"}, indent=2))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ..eval.compare import collect_summaries, comparison_plot, comparison_table
    from ..utils.io import write_text_atomic

    summaries = collect_summaries(args.paths)
    table = comparison_table(summaries, args.metrics)
    print(table)
    if args.output:
        write_text_atomic(args.output, table)
    if args.plot:
        comparison_plot(summaries, args.plot, args.metrics)
    return 0


def _eval_run_task(args: argparse.Namespace) -> int:
    """``--task run``: the synthetic task the model was trained on, from its run's recipe."""
    from ..eval.harness import evaluate_run_task

    if not args.model:
        raise SystemExit("mutor eval --task run needs --model")
    suffix = f"-{args.source}" if args.source else ""
    out = args.output_dir or str(Path(args.model) / "eval" / f"run-task{suffix}")
    try:
        result = evaluate_run_task(args.model, output_dir=out, device=args.device, dtype=args.dtype,
                                   source=args.source)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"mutor eval: {err}") from None
    if not args.quiet:
        print(json.dumps(result, indent=2))
    return 0


def _eval_options(args: argparse.Namespace) -> dict:
    """The keyword arguments every ``evaluate_model`` call of this command shares, checked."""
    common = dict(limit=args.limit, batch_size=args.batch_size, prefix_attention=args.prefix_attention,
                  max_new_tokens=args.max_new_tokens, tokenizer=args.tokenizer, progress=not args.quiet,
                  device=args.device, dtype=args.dtype, scorer=args.scorer)
    if args.limit is not None and args.limit < 1 or args.batch_size < 1:
        raise SystemExit("mutor eval: --limit and --batch-size must be >= 1")
    if args.draft_registers is not None:
        if args.checkpoints:
            raise SystemExit("mutor eval: --draft-registers works with --model (one MuToR checkpoint)")
        k = args.draft_registers
        if k != "auto" and not (k.isdigit() and int(k) >= 1):
            raise SystemExit(f"mutor eval: --draft-registers must be 'auto' or an integer >= 1, got {k!r}")
        common["draft_registers"] = k if k == "auto" else int(k)
    return common


def _eval_model(args: argparse.Namespace, common: dict) -> dict:
    """``--model``: the benchmark's test split(s), or ``--split``; one summary, or ``{"splits": [...]}``."""
    from ..eval.harness import evaluate_model, get_benchmark, load_model_and_tokenizer

    benchmark = get_benchmark(args.task)
    splits = [args.split] if args.split else list(benchmark.test_splits)
    known = list(dict.fromkeys(["test", "validation", *benchmark.test_splits]))
    if args.split not in (None, *known):
        raise SystemExit(f"mutor eval: task {args.task!r} has no split {args.split!r}; splits: {known}")
    loaded = None
    if len(splits) > 1 and args.draft_registers is None:   # several splits: load the model once
        loaded = load_model_and_tokenizer(args.model, args.tokenizer, dtype=args.dtype, device=args.device)
    results = []
    for split in splits:
        out = (str(Path(args.output_dir) / split) if args.output_dir and len(splits) > 1 else args.output_dir) \
            or str(Path(args.model) / "eval" / f"{args.task}-{split}")
        results.append(evaluate_model(args.task, args.model, split=split, data=args.data, output_dir=out,
                                      model_and_tokenizer=loaded, **common))
    return results[0] if len(results) == 1 else {"splits": results}
