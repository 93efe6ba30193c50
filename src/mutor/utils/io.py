"""Atomic file writes: a result file or plot is either the old one or the complete new one.

Everything mutor writes for users (results, summaries, plots, JSONL) goes through
:func:`atomic_write`: the content is written to a temporary sibling, then renamed into
place, so an interrupted run never leaves a half-written file behind. Checkpoint
directories are built whole beside their destination and swapped in
(:func:`replace_directory`). :func:`run_json_files` and :func:`lora_base_dir` find what a run
saved; :func:`yaml_load` reads recipes (YAML 1.2 scalars) with one-line syntax errors.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Union

import yaml

from .errors import MutorUserError

PathLike = Union[str, os.PathLike]


def atomic_write(path: PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary sibling of ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)               # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary sibling renamed into place)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json_atomic(path: PathLike, obj: Any, allow_nan: bool = True) -> None:
    """Write ``obj`` to ``path`` atomically as indented JSON.

    Args:
        path: The file.
        obj: What to write.
        allow_nan: False: refuse a NaN or infinite number (``ValueError`` naming the file, nothing written), so
            that the file is strict JSON; True writes them as ``NaN`` / ``Infinity``, which Python's ``json``
            reads back but strict parsers refuse.
    """
    try:
        text = json.dumps(obj, indent=2, allow_nan=allow_nan)
    except ValueError as err:
        raise ValueError(f"{path}: not written: {err}") from None
    write_text_atomic(path, text + "\n")


def write_jsonl_atomic(path: PathLike, rows: Iterable[dict]) -> None:
    """Write ``rows`` to ``path`` atomically as JSON lines (UTF-8, not ASCII-escaped)."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def replace_directory(dest: PathLike, fill: Callable[[Path], None]) -> None:
    """Build a directory with ``fill(tmp_dir)`` in a temporary sibling, then swap it in for ``dest``.

    A crash while filling leaves ``dest`` as it was (and no temporary directory behind).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        fill(tmp)
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / "ckpt")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def lora_base_dir(adapter_dir: PathLike) -> Union[Path, str, None]:
    """The base model of a peft adapter directory, as ``mutor train`` records it.

    ``base_model_name_or_path`` in ``adapter_config.json``: an absolute path or Hub id is returned
    as is; a relative path (``"base"``: the saved random-init base of a LoRA run) is looked up
    beside the adapter, then one level up (a ``checkpoint-N`` inside the run). None when the adapter
    records no base, or a relative one found nowhere.
    """
    adapter_dir = Path(adapter_dir)
    name = json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if name is None:
        return None
    if Path(name).is_absolute():
        return Path(name)
    for d in (adapter_dir, adapter_dir.parent):
        if (d / name / "config.json").is_file():
            return d / name
    if Path(name).is_dir():
        return Path(name)
    return None if name == "base" else name          # else a Hub id


def run_json_files(model_dir: PathLike, name: str) -> Iterator[dict]:
    """The JSON file ``name`` of a run, parsed: from ``model_dir`` itself, then from its parent
    (a ``checkpoint-N`` directory inside the run), for each of the two that has it."""
    for d in (Path(model_dir), Path(model_dir).parent):
        f = d / name
        if f.is_file():
            yield json.loads(f.read_text())


# ------------------------------------------------------------------ reading recipes
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


def yaml_load(text: str, source: str = "YAML"):
    """Parse ``text``; a syntax error is one :class:`MutorUserError` naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise MutorUserError(f"{source}:{where}: YAML syntax error: {problem}") from None
