"""mkdocs hook: the reference tables of the docs, generated from the code so that they cannot drift from it.

A page asks for a table with a one-line HTML comment; the hook replaces it before the page is rendered:

* ``<!-- mutor:fields mutor.methods.mutor.MuToRConfig -->``: a dataclass's fields (key, type, default and the
  ``metadata["help"]`` text), for MuToRConfig, MultiTokenConfig, NextTokenConfig and a recipe's blocks.
* ``<!-- mutor:presets -->``: the random-init model shapes a recipe's ``model.preset`` names.
* ``<!-- mutor:families -->``: the model families the equivalence tests build (``tests/families.py``) and the
  families refused at construction, with the refusal's reason (``mutor.core.support``).
* ``<!-- mutor:recipes -->``: every recipe shipped in ``mutor/configs`` (methods, model, task, budget).
* ``<!-- mutor:cli train -->``: the ``--help`` text of one ``mutor`` command.
* ``<!-- mutor:task-keys TASK -->`` before a hand-written Markdown table: the data options a task accepts
  have no help text in the code (they are plain dicts), so their table is written by hand; the hook checks that
  its first column names exactly the keys the task's builder accepts, plus the keys every task has (the fields
  of ``mutor.run.arguments.DataArguments``), and warns (an error under ``mkdocs build --strict``) when one is
  missing or no longer exists.

An unknown ``mutor:`` directive is a warning too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import io
import logging
import os
import re
import sys
import typing
from contextlib import redirect_stdout
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.reference")

_DIRECTIVE = re.compile(r"^<!-- mutor:(?P<kind>[a-z-]+)(?: (?P<arg>[^>]*?))? -->[ \t]*$", re.M)


def on_config(config, **kwargs):
    src = str(Path(config["config_file_path"]).parent / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return config


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    def replace(m: re.Match) -> str:
        kind, arg = m.group("kind"), (m.group("arg") or "").strip()
        where = page.file.src_uri
        try:
            if kind == "fields":
                return fields_table(arg)
            if kind == "recipes":
                return recipes_table()
            if kind == "presets":
                return presets_table()
            if kind == "families":
                return families_table(Path(config["config_file_path"]).parent / "tests")
            if kind == "cli":
                return cli_help(arg)
            if kind == "task-keys":
                check_task_keys(arg, markdown[m.end():], where)
                return ""
        except Exception as err:                      # a table that cannot be built is a broken page
            log.warning("%s: mutor:%s %s: %s: %s", where, kind, arg, type(err).__name__, err)
            return ""
        log.warning("%s: unknown directive mutor:%s", where, kind)
        return ""

    return _DIRECTIVE.sub(replace, markdown)


# ------------------------------------------------------------------ text helpers
def _escape(text: str) -> str:
    """Help text as Markdown table cell: code spans kept, Markdown's special characters escaped outside them."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    out = []
    for p in parts:
        if p.startswith("`") and p.endswith("`") and len(p) > 1:
            out.append(p)                          # a table's cells may hold `|` inside code spans
        else:
            out.append(re.sub(r"([\\*_|<>\[\]#])", r"\\\1", p))
    return "".join(out)


def _type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if tp is type(None):
        return "null"
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "see below"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == {}:
        return "`{}`"
    return f"`{value}`"


def _import(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------ directives
def fields_table(path: str) -> str:
    """A dataclass's init fields: key, type, default, help."""
    cls = _import(path)
    hints = typing.get_type_hints(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        help_text = f.metadata.get("help")
        if not help_text:
            raise ValueError(f"field {f.name} of {path} has no metadata['help']")
        rows.append(f"| `{f.name}` | {_type_name(hints.get(f.name, f.type))} | {_default(f)} | {_escape(help_text)} |")
    return "\n".join(rows) + "\n"


def recipes_table() -> str:
    """Every shipped recipe: its name for ``mutor train``, methods, model, task and budget."""
    import yaml

    from mutor.run.recipe import CONFIG_DIR

    rows = ["| recipe | methods | model | data.task | LoRA | budget |", "|---|---|---|---|---|---|"]
    for f in sorted(CONFIG_DIR.rglob("*.yaml")):
        name = str(f.relative_to(CONFIG_DIR).with_suffix(""))
        if name.startswith("accelerate/"):
            continue
        r = yaml.safe_load(f.read_text()) or {}
        methods = r.get("method", "mutor")
        methods = ", ".join(methods) if isinstance(methods, list) else str(methods)
        model = r.get("model") or {}
        model_name = model.get("name_or_path") or f"random-init `{model.get('preset', 'tiny-llama')}`"
        task = (r.get("data") or {}).get("task", "-")
        if task == "reasoning_gym" and (r.get("data") or {}).get("dataset"):
            task += f" ({r['data']['dataset']})"
        t = r.get("training") or {}
        budget = (f"{t['max_steps']} steps" if t.get("max_steps") else
                  f"{t['num_train_epochs']} epochs" if t.get("num_train_epochs") else "-")
        lora = "r=" + str(r["lora"].get("r", 8)) if r.get("lora") else "no"
        rows.append(f"| `{name}` | {methods} | {model_name} | `{task}` | {lora} | {budget} |")
    return "\n".join(rows) + "\n"


def presets_table() -> str:
    """``mutor.models.presets.PRESETS``: name, family and shape."""
    from mutor.models.presets import PRESETS

    rows = ["| preset | family | hidden | layers | heads | kv heads | intermediate |", "|---|---|---|---|---|---|---|"]
    for name, (family, hidden, layers, heads, kv, inter) in PRESETS.items():
        rows.append(f"| `{name}` | {family} | {hidden} | {layers} | {heads} | {kv} | {inter} |")
    return "\n".join(rows) + "\n"


def families_table(tests: Path) -> str:
    """Verified and refused families, from the tests' own tables, so the page lists exactly what is tested."""
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    families = importlib.import_module("families")
    from mutor.core import support

    rows = ["| family (`model_type`) | status | what its test exercises |", "|---|---|---|"]
    for name in families.FAMILIES:
        extra = [w for w, on in (("sliding windows that bind", name in families.SLIDING),
                                 ("FlexAttention against sdpa", name in families.FLEX)) if on]
        what = "the full matrix: both register embeddings, every offset, bidirectional prefixes, 2D offsets, " \
               "random register subsets" + "".join(", " + e for e in extra)
        rows.append(f"| {name} | exact (core) | {what} |")
    for name, (_, attn, note) in families.MORE_FAMILIES.items():
        what = _escape(note) + ("; " if note else "") + f"{attn} attention"
        rows.append(f"| {name} | exact | {what} |")
    reasons = {support.ALIBI: "ALiBi positions", support.RECURRENT: "state-space, recurrent or convolution layers",
               support.CHUNKED: "chunked attention layers"}
    refused = {}
    for name, (extra, _) in families.REFUSED_FAMILIES.items():
        reason = support.refusal_reason(families._config(name, extra))   # the tiny config the test builds
        if reason is None:
            raise ValueError(f"{name} is listed as refused but mutor.core.support accepts it")
        key = next((v for k, v in reasons.items() if reason.startswith(k)), reason)
        label = f"{name} (`alibi=True`)" if name == "falcon" else name
        refused.setdefault(key, []).append(label)
    for reason, names in refused.items():
        rows.append(f"| {', '.join(names)} | refused | {reason} |")
    return "\n".join(rows) + "\n"


def cli_help(command: str) -> str:
    """``mutor COMMAND --help`` as the terminal prints it, 100 columns wide."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        from mutor.run.cli import build_parser

        parser = build_parser()
        if command:
            sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
            parser = sub.choices[command]
        out = io.StringIO()
        with redirect_stdout(out):
            parser.print_help()
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "```text\n" + out.getvalue().rstrip() + "\n```\n"


def task_keys(task: str) -> set[str]:
    """The data options ``task`` accepts, as its builder states them when handed one it does not know."""
    from mutor.data.registry import build_training_data
    from mutor.run.arguments import DataArguments

    # the keys the run reads from the data block itself, for every task, before the task's builder sees the rest
    run_keys = {f.name for f in dataclasses.fields(DataArguments) if f.init}
    try:
        build_training_data(task, {"__no_such_option__": 1}, tokenizer=None, seed=0)
    except Exception as err:                          # the builder's refusal lists what it takes
        listed = re.findall(r"\[[^\[\]]*\]", str(err))
        if listed:
            return set(ast.literal_eval(listed[-1])) | run_keys
        raise ValueError(f"task {task!r} refused an unknown option without listing its options: {err}") from None
    raise ValueError(f"task {task!r} accepted an unknown option")


def check_task_keys(task: str, rest: str, where: str) -> None:
    """The first Markdown table after the directive must list exactly ``task``'s keys, each as `key`."""
    table = re.search(r"((?:^\|.*\|[ \t]*\n)+)", rest, re.M)
    if table is None:
        raise ValueError("no table follows the directive")
    documented = set()
    for line in table.group(1).splitlines()[2:]:
        first = line.strip().strip("|").split("|")[0]
        documented |= set(re.findall(r"`([^`]+)`", first))
    wanted = task_keys(task)
    missing, extra = sorted(wanted - documented), sorted(documented - wanted)
    if missing or extra:
        log.warning("%s: the data options of task %r differ from the code: undocumented %s, documented but not "
                    "accepted %s", where, task, missing, extra)
