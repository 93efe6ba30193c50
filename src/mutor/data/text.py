"""Text tasks: the paper's prompt/completion datasets, any prompt/completion data, and plain-text corpora.

All of them load with ``datasets`` the way its users do: ``load_dataset(hub_id, config,
split=...)`` for the Hub, or ``load_dataset("json"|"parquet", data_files=path)`` for a local
file (``data.path`` in a recipe). Tests and CPU recipes use small files under ``tests/fixtures``.

Prompt/completion examples become ``prompt_ids + completion_ids + [eos]`` with the loss on the
completion (and eos) only. Prompt and completion are tokenized separately, so the prompt's
tokens are exactly what evaluation feeds the model before it generates. Examples longer than
``max_length`` tokens are dropped, as the paper does (512; 768 for 1M-MATH and summarization),
and the count is reported in ``TrainingData.info``.

Plain-text corpora (``task: text``) put the loss on every token; each document is tokenized,
ends with eos and is cut into pieces of at most ``max_length`` tokens. They are meant to be
packed (``packing: true``, the default for ``text``): the collator concatenates a batch into
one row with per-document position ids, so neither attention nor a register target crosses
documents.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ..core.layout import IGNORE_INDEX
from .registry import TrainingData, register_task
from .templates import TEMPLATES, TextTemplate, get_template, render_completion, render_prompt

_COMMON = {"path", "split", "limit", "max_length", "eval_path", "eval_split", "eval_limit", "num_proc"}


def _check_options(options: dict, allowed: set, task: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"data options {unknown} are not understood by task {task!r}; it takes {sorted(allowed)}")


def load_rows(path: Optional[str] = None, hub_id: Optional[str] = None, hub_config: Optional[str] = None,
              split: Optional[str] = "train"):
    """A ``datasets.Dataset`` from a local JSON/JSONL/Parquet/CSV file (or directory of them), or from the Hub."""
    import datasets

    if path is not None:
        p = os.fspath(path)
        if not os.path.exists(p):
            raise FileNotFoundError(f"data.path {p!r} does not exist")
        files = sorted(os.path.join(p, f) for f in os.listdir(p)) if os.path.isdir(p) else [p]
        ext = os.path.splitext(files[0])[1].lower().lstrip(".")
        builder = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv", "txt": "text"}.get(ext)
        if builder is None:
            raise ValueError(f"data.path {p!r}: unsupported file type {ext!r} (use .jsonl, .json, .parquet, .csv, .txt)")
        if all(os.path.getsize(f) == 0 for f in files):
            raise ValueError(f"data.path {p!r} is empty: no examples to read")
        try:
            return datasets.load_dataset(builder, data_files=files, split="train")
        except (StopIteration, datasets.exceptions.DatasetGenerationError) as err:   # e.g. only blank lines
            raise ValueError(f"data.path {p!r}: cannot read it as {builder} ({type(err).__name__}: {err})") from None
    if hub_id is None:
        raise ValueError("give data.path (a local file) or a Hub dataset id")
    return _load_hub_dataset(hub_id, hub_config, split)


def _load_hub_dataset(hub_id: str, hub_config: Optional[str], split: Optional[str]):
    """``load_dataset`` from the Hub after one quick question to it: unreachable, the local cache is used
    (datasets' offline mode), and without one the failure is one line, not a minute of retries."""
    import datasets
    import huggingface_hub

    from ..utils.errors import HUB_PROBE_TIMEOUT_S, MutorUserError, is_offline

    if is_offline():
        return datasets.load_dataset(hub_id, hub_config, split=split)
    try:
        huggingface_hub.dataset_info(hub_id, timeout=HUB_PROBE_TIMEOUT_S)
    except huggingface_hub.utils.RepositoryNotFoundError:
        raise MutorUserError(f"dataset {hub_id!r}: no such dataset on the Hugging Face Hub (or it is private); "
                             "give data.path / --data, a local file") from None
    except huggingface_hub.utils.GatedRepoError:
        pass                      # datasets gives its own message about the token
    except Exception as err:      # no network, DNS failure, timeout, proxy error: try the local cache only
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        before = datasets.config.HF_HUB_OFFLINE
        datasets.config.HF_HUB_OFFLINE = True
        try:
            return datasets.load_dataset(hub_id, hub_config, split=split)
        except Exception:
            raise MutorUserError(f"dataset {hub_id!r}: cannot reach the Hugging Face Hub ({reason}) and it is not in "
                                 "the local cache; connect, or give data.path / --data, a local file") from None
        finally:
            datasets.config.HF_HUB_OFFLINE = before
    return datasets.load_dataset(hub_id, hub_config, split=split)


def need_tokenizer(tokenizer, task: str):
    if tokenizer is None:
        raise ValueError(f"task {task!r} needs a tokenizer: set model.tokenizer (or model.name_or_path)")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer {type(tokenizer).__name__} has no eos token; text tasks end every "
                         "completion with eos")


def tokenize_pair(tokenizer, prompt: str, completion: str) -> dict:
    """``prompt + completion + eos``; labels -100 on the prompt."""
    p = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return {"input_ids": p + c, "labels": [IGNORE_INDEX] * len(p) + c}


def encode_pairs(rows: list[dict], template: TextTemplate, tokenizer, max_length: int,
                 num_proc: Optional[int] = None):
    """Generated rows (gsm_symbolic, reasoning_gym) rendered with ``template`` and tokenized; examples longer
    than ``max_length`` dropped. Returns (dataset, number dropped)."""
    import datasets

    fields = sorted({k for r in rows for k in r if isinstance(r[k], str)})     # the template's text fields
    ds = datasets.Dataset.from_list([{k: r[k] for k in fields} for r in rows])
    enc = ds.map(lambda ex: tokenize_pair(tokenizer, template.prompt.format(**ex), template.completion.format(**ex)),
                 remove_columns=ds.column_names, num_proc=num_proc, desc="tokenizing")
    kept = enc.filter(lambda ex: len(ex["input_ids"]) <= max_length)
    return kept, len(enc) - len(kept)


def run_data_block(model_path: Optional[str], task: str) -> dict:
    """The ``data`` block of the run a model directory (or a checkpoint inside it) came from, when that run
    trained ``task``; else ``{}``. Generated tasks rebuild their evaluation splits from it."""
    from pathlib import Path

    from ..utils.io import yaml_load

    if model_path is None:
        return {}
    p = Path(model_path)
    for d in (p, p.parent, p.parent.parent):
        f = d / "recipe.yaml"
        if f.is_file():
            data = (yaml_load(f.read_text(), str(f)) or {}).get("data") or {}
            return data if data.get("task") == task else {}
    return {}


def _finish(rows, tokenizer, render, max_length: int, limit: Optional[int], num_proc: Optional[int]):
    """Tokenize, drop examples longer than ``max_length``; return (dataset, n_before, n_dropped)."""
    if limit is not None:
        rows = rows.select(range(min(int(limit), len(rows))))
    cols = rows.column_names

    def encode(ex):
        prompt, completion = render(ex)
        return tokenize_pair(tokenizer, prompt, completion)

    enc = rows.map(encode, remove_columns=cols, num_proc=num_proc, desc="tokenizing")
    n = len(enc)
    enc = enc.filter(lambda ex: len(ex["input_ids"]) <= max_length, num_proc=num_proc)
    return enc, n, n - len(enc)


def _missing_columns(template: TextTemplate, rows) -> list[str]:
    """Template fields the data does not have (checked on the first example, after ``prepare``)."""
    import string

    if len(rows) == 0:
        return []
    try:
        have = set(template.prepare(dict(rows[0])))
    except KeyError as err:
        return [str(err.args[0])]
    formats = (template.prompt, template.completion)
    wanted = {f for fmt in formats for _, f, _, _ in string.Formatter().parse(fmt) if f}
    return sorted(wanted - have)


def _check_no_empty_fields(template: TextTemplate, rows, path, what: str) -> None:
    """A row whose template field is missing (``None`` once ``datasets`` merges the rows' keys) would be trained
    as the text "None": refuse it, naming the file, the row and the field."""
    import string

    from ..utils.errors import MutorUserError

    formats = (template.prompt, template.completion)
    fields = {f for fmt in formats for _, f, _, _ in string.Formatter().parse(fmt) if f}
    wanted = sorted(fields & set(rows.column_names))
    for field in wanted:
        empty = [i for i, v in enumerate(rows[field]) if v is None]
        if empty:
            where = f"data.{'eval_path' if what == 'evaluation' else 'path'} {path!r}" if path else \
                f"the {what} data"
            raise MutorUserError(f"{where}: row {empty[0]} (0-based, in file order) has no {field!r}, which task "
                                 f"{template.name!r} uses" + (f" ({len(empty)} rows in all)" if len(empty) > 1 else
                                                              "") + "; fill it in or remove the row")


def build_from_template(template: TextTemplate, options: dict, tokenizer, seed: int) -> TrainingData:
    """Training (and optional evaluation) data of a prompt/completion task rendered by ``template``."""
    _check_options(options, _COMMON, template.name)
    need_tokenizer(tokenizer, template.name)
    max_length = int(options.get("max_length", template.max_length))

    def rows_for(path, split, what):
        rows = load_rows(path, template.hub_id, template.hub_config, split)
        if template.filter is not None:
            rows = rows.filter(template.filter)
        if template.sample is not None and len(rows) > template.sample:
            rows = rows.shuffle(seed=template.sample_seed).select(range(template.sample))
        if len(rows) == 0:
            raise ValueError(f"task {template.name!r}: no {what} examples left (path={path!r}, split={split!r})")
        return rows

    split = options.get("split", template.splits.get("train"))
    if split is None and options.get("path") is None:
        raise ValueError(f"task {template.name!r} has no training split on the Hub ({template.notes}); "
                         "give data.path")
    render = lambda ex: (render_prompt(template, ex), render_completion(template, ex))  # noqa: E731
    rows = rows_for(options.get("path"), split, "training")
    missing = _missing_columns(template, rows)
    if missing:
        raise ValueError(f"task {template.name!r}: the training data lacks column(s) {missing} that the template "
                         f"uses; it has {rows.column_names}")
    _check_no_empty_fields(template, rows, options.get("path"), "training")
    train, n, dropped = _finish(rows, tokenizer, render, max_length, options.get("limit"), options.get("num_proc"))
    if len(train) == 0:
        raise ValueError(f"task {template.name!r}: all {n} training examples are longer than "
                         f"max_length={max_length} tokens and were dropped; nothing to train on (raise "
                         "data.max_length?)")
    info = {"num_examples": len(train), "dropped_too_long": dropped, "max_length": max_length, "loaded": n}
    eval_ds = None
    if options.get("eval_path") is not None or options.get("eval_split") is not None:
        eval_rows = rows_for(options.get("eval_path"), options.get("eval_split"), "evaluation")
        _check_no_empty_fields(template, eval_rows, options.get("eval_path"), "evaluation")
        eval_ds, _, d_e = _finish(eval_rows, tokenizer, render, max_length, options.get("eval_limit"),
                                  options.get("num_proc"))
        info.update(eval_examples=len(eval_ds), eval_dropped_too_long=d_e)
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=max_length, info=info)


def pad_id_of(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


for _name in TEMPLATES:
    def _builder(options: dict, tokenizer: Any, seed: int, _task=_name) -> TrainingData:
        return build_from_template(get_template(_task), options, tokenizer, seed)

    register_task(_name)(_builder)


@register_task("prompt_completion")
def build_prompt_completion(options: dict, tokenizer, seed: int) -> TrainingData:
    """Any prompt/completion data: ``prompt_template``/``completion_template`` are ``str.format`` strings
    over the example's fields (default: fields ``prompt`` and ``completion`` as they are)."""
    extra = {"hub_id", "hub_config", "prompt_template", "completion_template"}
    _check_options(options, _COMMON | extra, "prompt_completion")
    template = TextTemplate(name="prompt_completion", hub_id=options.get("hub_id"),
                            hub_config=options.get("hub_config"), prompt=options.get("prompt_template", "{prompt}"),
                            completion=options.get("completion_template", "{completion}"),
                            answer_field="completion", splits={"train": options.get("split", "train")},
                            max_length=int(options.get("max_length", 512)))
    rest = {k: v for k, v in options.items() if k not in extra}
    return build_from_template(template, rest, tokenizer, seed)


@register_task("text")
def build_text(options: dict, tokenizer, seed: int) -> TrainingData:
    """Plain-text pretraining data: loss on every token, documents cut into ``max_length`` pieces, packed."""
    allowed = (_COMMON - {"eval_split"}) | {"hub_id", "hub_config", "text_field"}
    _check_options(options, allowed | {"eval_split"}, "text")
    need_tokenizer(tokenizer, "text")
    max_length = int(options.get("max_length", 1024))
    field = options.get("text_field", "text")

    def build(path, split, limit):
        rows = load_rows(path, options.get("hub_id"), options.get("hub_config"), split)
        if field not in rows.column_names:
            raise ValueError(f"text data has no field {field!r} (fields: {rows.column_names}); set data.text_field")
        if limit is not None:
            rows = rows.select(range(min(int(limit), len(rows))))

        def chunk(batch):
            out = {"input_ids": [], "labels": []}
            for text in batch[field]:
                ids = tokenizer(text, add_special_tokens=True)["input_ids"] + [tokenizer.eos_token_id]
                for i in range(0, len(ids), max_length):
                    piece = ids[i:i + max_length]
                    if len(piece) > 1:                      # a 1-token piece carries no next-token target
                        out["input_ids"].append(piece)
                        out["labels"].append(list(piece))
            return out

        return rows.map(chunk, batched=True, remove_columns=rows.column_names, num_proc=options.get("num_proc"),
                        desc="tokenizing")

    train = build(options.get("path"), options.get("split", "train"), options.get("limit"))
    eval_ds = None
    if options.get("eval_path") is not None or options.get("eval_split") is not None:
        eval_ds = build(options.get("eval_path"), options.get("eval_split"), options.get("eval_limit"))
    info = {"num_examples": len(train), "max_length": max_length, "dropped_too_long": 0}
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=max_length, info=info, packing=True)
