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

import contextlib
import os
from typing import Any, Optional

from ..core.layout import IGNORE_INDEX
from .registry import TrainingData, check_options, register_task
from .templates import TEMPLATES, TextTemplate, get_template, render_completion, render_prompt

_COMMON = {"path", "split", "limit", "max_length", "eval_path", "eval_split", "eval_limit", "num_proc"}


def load_rows(path: Optional[str] = None, hub_id: Optional[str] = None, hub_config: Optional[str] = None,
              split: Optional[str] = "train", what: str = "data.path"):
    """A ``datasets.Dataset`` from a local JSON/JSONL/Parquet/CSV file (or directory of them), or from the Hub.

    Args:
        path: A local file or directory; ``None`` loads ``hub_id`` instead.
        hub_id: A Hub dataset id, used when ``path`` is ``None``.
        hub_config: The Hub dataset's configuration name.
        split: The Hub split.
        what: How the user named ``path`` (``data.path``, ``data.eval_path``, ``--data``): every error says it.

    Returns:
        The rows, a ``datasets.Dataset``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        MutorUserError: A file that is not UTF-8 text, or a JSON line that does not parse (naming the file and
            the line), an unsupported file type, an empty file.
    """
    import datasets

    from ..utils.errors import MutorUserError

    if path is not None:
        p = os.fspath(path)
        if not os.path.exists(p):
            raise FileNotFoundError(f"{what} {p!r} does not exist")
        files = sorted(os.path.join(p, f) for f in os.listdir(p)) if os.path.isdir(p) else [p]
        ext = os.path.splitext(files[0])[1].lower().lstrip(".")
        builder = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv", "txt": "text"}.get(ext)
        if builder is None:
            raise ValueError(f"{what} {p!r}: unsupported file type {ext!r} (use .jsonl, .json, .parquet, .csv, .txt)")
        if all(os.path.getsize(f) == 0 for f in files):
            raise ValueError(f"{what} {p!r} is empty: no examples to read")
        if builder != "parquet":          # Arrow keeps undecodable bytes and fails later, far from the file
            for f in files:
                _check_utf8(f, what)
        try:
            with _quiet_datasets():
                return datasets.load_dataset(builder, data_files=files, split="train")
        except (StopIteration, datasets.exceptions.DatasetGenerationError) as err:   # e.g. only blank lines
            if builder == "json":
                for f in files:
                    _check_json_lines(f, what)
            cause = err.__cause__ or err.__context__
            reason = f"{type(cause).__name__}: {str(cause).splitlines()[0]}" if cause and str(cause) else \
                f"{type(err).__name__}: {err}"
            raise MutorUserError(f"{what} {p!r}: cannot read it as {builder} ({reason})") from None
    if hub_id is None:
        raise ValueError(f"give {what} (a local file) or a Hub dataset id")
    return _load_hub_dataset(hub_id, hub_config, split)


@contextlib.contextmanager
def _quiet_datasets():
    """A local file loads without ``datasets``' progress bar and parse-error log: a file that does not parse is
    reported once, as one line naming the file and line (:func:`_check_json_lines`)."""
    import logging

    from datasets.utils import logging as ds_logging

    bars_were_on = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    log = logging.getLogger("datasets.packaged_modules.json.json")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
        if bars_were_on:
            ds_logging.enable_progress_bar()


def _check_utf8(file: str, what: str) -> None:
    """Refuse a file that is not UTF-8, naming its first bad line and byte."""
    import codecs

    from ..utils.errors import MutorUserError

    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(file, "rb") as fh:
            while chunk := fh.read(1 << 24):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        return
    except UnicodeDecodeError:
        pass
    with open(file, "rb") as fh:                           # find the line, only when there is one to find
        for n, line in enumerate(fh, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise MutorUserError(f"{what} {file!r}: line {n} is not UTF-8 text (byte 0x{line[err.start]:02x} at "
                                     f"column {err.start + 1}); save the file as UTF-8") from None
    raise MutorUserError(f"{what} {file!r}: ends inside a UTF-8 character (truncated?); save the file as UTF-8")


def _json_reason(err) -> str:
    """``json``'s complaint with its column: "unterminated string starting at column 17"."""
    msg = err.msg[:1].lower() + err.msg[1:]
    return f"{msg}{'' if msg.endswith(' at') else ' at'} column {err.colno}"


def _check_json_lines(file: str, what: str) -> None:
    """Refuse a JSON file that does not parse: a JSON Lines file by its first bad line, a whole JSON document (a
    list of rows) by where the parser stopped."""
    import json

    from ..utils.errors import MutorUserError

    with open(file, encoding="utf-8") as fh:
        text = fh.read()
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
            return
        except json.JSONDecodeError as err:
            raise MutorUserError(f"{what} {file!r}: line {err.lineno} is not valid JSON: {_json_reason(err)}") from None
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise MutorUserError(f"{what} {file!r}: line {n} is not valid JSON: {_json_reason(err)} (a truncated "
                                 "line?)") from None
        if not isinstance(row, dict):
            raise MutorUserError(f"{what} {file!r}: line {n} is a JSON {type(row).__name__}, not an object (one row "
                                 "per line: {\"field\": value, ...})")


def _load_hub_dataset(hub_id: str, hub_config: Optional[str], split: Optional[str]):
    """``load_dataset`` from the Hub after one quick question to it: unreachable, the local cache is used
    (datasets' offline mode), and without one the failure is one line, not a minute of retries."""
    import datasets
    import huggingface_hub

    from ..utils.errors import MutorUserError
    from ..utils.hub import HUB_PROBE_TIMEOUT_S, is_offline

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
    """Raise ``ValueError`` unless ``tokenizer`` exists and has an eos token, as text task ``task`` needs."""
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


def find_run_recipe(model_path: Optional[str]):
    """The recorded recipe of the run a model directory (or a checkpoint inside it) came from.

    Args:
        model_path: A run directory, a ``checkpoint-N`` inside one, or ``None``.

    Returns:
        ``(path of recipe.yaml, its mapping)``, or ``None`` when there is none (a Hub id, a bare model).
    """
    from pathlib import Path

    from ..utils.io import yaml_load

    if model_path is None:
        return None
    p = Path(model_path)
    for d in (p, p.parent, p.parent.parent):
        f = d / "recipe.yaml"
        if f.is_file():
            return f, (yaml_load(f.read_text(), str(f)) or {})
    return None


def resolve_data_path(value, source_dir: Optional[str]):
    """A recipe's data path as ``mutor train`` finds it: as given if it exists from the working directory (or is
    absolute), else relative to the directory of the recipe the run was started with (``source_dir``).

    Args:
        value: The path a recipe names; anything but a string is returned as it is.
        source_dir: The recipe file's directory, or ``None``.

    Returns:
        The path to open, or ``value`` as given when neither place has it.
    """
    from pathlib import Path

    if not isinstance(value, str) or Path(value).is_absolute() or Path(value).exists() or source_dir is None:
        return value
    cand = Path(source_dir) / value
    return str(cand) if cand.exists() else value


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


def check_template_columns(template: TextTemplate, rows, path: Optional[str], what: str) -> None:
    """Refuse data that lacks a field the templates use, naming the file (or the Hub dataset) and its fields.

    Args:
        template: The prompt/completion templates.
        rows: The loaded ``datasets.Dataset``.
        path: The local file the rows came from, ``None`` for a Hub dataset.
        what: How the user named ``path`` (``data.path``, ``--data``).

    Raises:
        MutorUserError: A field is missing; rows with a ``messages`` column are pointed to ``data.task: chat``.
    """
    from ..utils.errors import MutorUserError

    missing = _missing_columns(template, rows)
    if not missing:
        return
    where = f"{what} {path!r}" if path else f"the Hub dataset {template.hub_id!r}"
    hint = ("; rows with a 'messages' list are chat data: data.task: chat" if "messages" in rows.column_names else
            "; name the fields in data.prompt_template / data.completion_template" if template.name ==
            "prompt_completion" else "")
    raise MutorUserError(f"{where}: its rows have no field(s) {missing}, which task {template.name!r} renders "
                         f"(prompt {template.prompt!r}, completion {template.completion!r}); the rows have "
                         f"{rows.column_names}{hint}")


def check_rows(template: TextTemplate, rows, path: Optional[str], what: str) -> None:
    """Refuse rows a template cannot render: a field no row has, or a row whose field the templates use is
    missing, empty or only whitespace.

    Args:
        template: The prompt/completion templates.
        rows: The loaded ``datasets.Dataset``.
        path: The local file the rows came from, ``None`` for a Hub dataset.
        what: How the user named ``path`` (``data.path``, ``--data``): the error says it.

    Raises:
        MutorUserError: Naming the file (or Hub dataset), and the row (:func:`row_name`) and the field: a field no
            row has, or one that is missing, empty or only whitespace in some row.
    """
    check_template_columns(template, rows, path, what)
    _check_no_empty_fields(template, rows, path, "rows", label=what)


def row_name(index: int, path: Optional[str] = None) -> str:
    """How an error names the row at 0-based ``index`` of the rows read from ``path``: ``"row 4"``, counted from 1
    in file order, which is the line number in a JSON Lines file; where blank lines make the two differ, the line
    too (``"row 4 (line 6)"``).

    Args:
        index: The row's 0-based position among the rows read.
        path: The local file the rows came from (``None``: a Hub dataset, or rows from elsewhere).

    Returns:
        The row's name, for a message.
    """
    name = f"row {index + 1}"
    if path is None or not os.path.isfile(os.fspath(path)) or not os.fspath(path).lower().endswith(".jsonl"):
        return name
    try:
        with open(os.fspath(path), encoding="utf-8") as fh:
            seen = 0
            for n, line in enumerate(fh, 1):
                seen += bool(line.strip())
                if seen == index + 1:
                    return name if n == index + 1 else f"{name} (line {n})"
    except (OSError, UnicodeDecodeError):
        pass
    return name


def is_empty_text(value) -> bool:
    """Whether a field's value renders as no text: missing (``None``), empty, or only whitespace."""
    return value is None or not str(value).strip()


def _check_no_empty_fields(template: TextTemplate, rows, path, what: str, label: Optional[str] = None) -> None:
    """A row whose template field is missing (``None`` once ``datasets`` merges the rows' keys), empty or only
    whitespace would be trained on the text "None" or on nothing (a completion of eos alone): refuse it, naming
    the file, the row and the field."""
    import string

    from ..utils.errors import MutorUserError

    formats = (template.prompt, template.completion)
    fields = {f for fmt in formats for _, f, _, _ in string.Formatter().parse(fmt) if f}
    wanted = sorted(fields & set(rows.column_names))
    bad = []                                              # (row, field, value) of each empty field
    for field in wanted:
        bad += [(i, field, v) for i, v in enumerate(rows[field]) if is_empty_text(v)]
    if bad:
        i, field, value = min(bad, key=lambda b: b[0])
        where = f"{label or 'data.' + ('eval_path' if what == 'evaluation' else 'path')} {path!r}" if path \
            else f"the {what} data"
        state = "has no" if value is None else "has an empty" if value == "" else "has only whitespace in"
        rows_in_all = len({b[0] for b in bad})
        raise MutorUserError(f"{where}: {row_name(i, path)} {state} {field!r}, which task {template.name!r} uses"
                             + (f" ({rows_in_all} rows in all)" if rows_in_all > 1 else "")
                             + "; fill it in or remove the row")


def build_from_template(template: TextTemplate, options: dict, tokenizer, seed: int) -> TrainingData:
    """Training (and optional evaluation) data of a prompt/completion task rendered by ``template``."""
    check_options(options, _COMMON, template.name)
    need_tokenizer(tokenizer, template.name)
    max_length = int(options.get("max_length", template.max_length))

    def rows_for(path, split, what):
        rows = load_rows(path, template.hub_id, template.hub_config, split,
                         what="data.eval_path" if what == "evaluation" else "data.path")
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
    check_template_columns(template, rows, options.get("path"), "data.path")
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
        check_template_columns(template, eval_rows, options.get("eval_path"), "data.eval_path")
        _check_no_empty_fields(template, eval_rows, options.get("eval_path"), "evaluation")
        eval_ds, _, d_e = _finish(eval_rows, tokenizer, render, max_length, options.get("eval_limit"),
                                  options.get("num_proc"))
        info.update(eval_examples=len(eval_ds), eval_dropped_too_long=d_e)
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=max_length, info=info)


def pad_id_of(tokenizer) -> int:
    """The tokenizer's padding id: its pad token, else its eos token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


for _name in TEMPLATES:
    def _builder(options: dict, tokenizer: Any, seed: int, _task=_name) -> TrainingData:
        return build_from_template(get_template(_task), options, tokenizer, seed)

    register_task(_name)(_builder)


PROMPT_COMPLETION_KEYS = _COMMON | {"hub_id", "hub_config", "prompt_template", "completion_template"}


def prompt_completion_template(options: dict) -> TextTemplate:
    """The templates a ``prompt_completion`` data block names, shared by training and ``mutor eval``.

    Args:
        options: The recipe's data block (``prompt_template``, ``completion_template``, ``hub_id``, ...).

    Returns:
        A :class:`TextTemplate` named ``prompt_completion`` (defaults ``"{prompt}"`` and ``"{completion}"``).

    Raises:
        MutorUserError: A template that is not a string (YAML reads an unquoted ``{prompt}`` as a mapping).
    """
    from ..utils.errors import MutorUserError

    defaults = {"prompt_template": "{prompt}", "completion_template": "{completion}"}
    for key, default in defaults.items():
        value = options.get(key, default)
        if not isinstance(value, str):
            shown = "{" + ", ".join(map(str, value)) + "}" if isinstance(value, dict) else repr(value)
            raise MutorUserError(f"data.{key} must be a string, got a {type(value).__name__} ({value!r}): YAML reads "
                                 f"{shown} unquoted as a mapping; quote it: {key}: \"{shown}\" in a recipe, "
                                 f"'data.{key}=\"{shown}\"' on the command line")
    return TextTemplate(name="prompt_completion", hub_id=options.get("hub_id"),
                        hub_config=options.get("hub_config"), prompt=options.get("prompt_template", "{prompt}"),
                        completion=options.get("completion_template", "{completion}"),
                        answer_field="completion", splits={"train": options.get("split", "train")},
                        max_length=int(options.get("max_length", 512)))


@register_task("prompt_completion")
def build_prompt_completion(options: dict, tokenizer, seed: int) -> TrainingData:
    """Any prompt/completion data: ``prompt_template``/``completion_template`` are ``str.format`` strings
    over the example's fields (default: fields ``prompt`` and ``completion`` as they are)."""
    check_options(options, PROMPT_COMPLETION_KEYS, "prompt_completion")
    template = prompt_completion_template(options)
    rest = {k: v for k, v in options.items() if k not in PROMPT_COMPLETION_KEYS - _COMMON}
    return build_from_template(template, rest, tokenizer, seed)


@register_task("text")
def build_text(options: dict, tokenizer, seed: int) -> TrainingData:
    """Plain-text pretraining data: loss on every token, documents cut into ``max_length`` pieces, packed."""
    allowed = (_COMMON - {"eval_split"}) | {"hub_id", "hub_config", "text_field"}
    check_options(options, allowed | {"eval_split"}, "text")
    need_tokenizer(tokenizer, "text")
    max_length = int(options.get("max_length", 1024))
    field = options.get("text_field", "text")

    def build(path, split, limit, what="data.path"):
        rows = load_rows(path, options.get("hub_id"), options.get("hub_config"), split, what=what)
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
        eval_ds = build(options.get("eval_path"), options.get("eval_split"), options.get("eval_limit"),
                        "data.eval_path")
    info = {"num_examples": len(train), "max_length": max_length, "dropped_too_long": 0}
    return TrainingData(train_dataset=train, eval_dataset=eval_ds, pad_token_id=pad_id_of(tokenizer),
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        max_length=max_length, info=info, packing=True)
