"""User errors, and loading pretrained models and tokenizers with one-line failures.

What is unusual here:

* :class:`MutorUserError` is a ``ValueError``: code that already catches ``ValueError`` keeps
  working, and the command line (:mod:`mutor.run.cli`) prints any of them as one line on stderr
  with exit status 2 instead of a traceback (``MUTOR_DEBUG=1`` or ``--debug`` keeps the
  traceback).
* :func:`from_pretrained` asks the Hugging Face Hub once, with a short timeout, before a Hub id
  is loaded. Without it, an offline machine spends 30-50 s in ``huggingface_hub``'s retries
  and ends in a long traceback; with it, the failure is one line after one attempt. A Hub
  id already in the local cache then loads from the cache (``local_files_only``).
* A local file that cannot be read (a truncated ``model.safetensors``) is named in the error.
* :func:`load_peft_model` loads a peft adapter directory on the base its run recorded, including
  the random-init base that ``mutor train`` saves beside a LoRA adapter (``base/``), which
  peft alone would look for on the Hub.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any, Callable

__all__ = ["MutorUserError", "did_you_mean", "from_pretrained", "hub_probe", "load_peft_model"]

HUB_PROBE_TIMEOUT_S = 5.0


class MutorUserError(ValueError):
    """Bad input from the user (a recipe, a path, a flag): the message names the problem and what was expected."""


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").upper() in ("1", "ON", "YES", "TRUE")


def hub_probe(name: str, what: str) -> dict:
    """Extra ``from_pretrained`` kwargs for Hub id ``name``, after one quick question to the Hub.

    Reachable and the repository exists: ``{}``. Unreachable: ``{"local_files_only": True}`` if the
    id is in the local cache, else a :class:`MutorUserError` saying so. Missing repository: a
    :class:`MutorUserError` naming it.
    """
    if is_offline():
        return {}
    import huggingface_hub
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        huggingface_hub.model_info(name, timeout=HUB_PROBE_TIMEOUT_S)
        return {}
    except GatedRepoError:
        return {}                 # gated: from_pretrained gives its own message about the token
    except RepositoryNotFoundError:
        raise MutorUserError(f"{what} {name!r}: not a local directory and no such model on the Hugging Face Hub "
                             "(or it is private: log in with `hf auth login`)") from None
    except Exception as err:       # no network, DNS failure, timeout, proxy error
        if huggingface_hub.try_to_load_from_cache(name, "config.json") is not None or \
                huggingface_hub.try_to_load_from_cache(name, "tokenizer_config.json") is not None:
            return {"local_files_only": True}
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise MutorUserError(f"{what} {name!r}: cannot reach the Hugging Face Hub ({reason}) and it is not in the "
                             "local cache; connect, give a local directory, or set HF_HUB_OFFLINE=1 to use cached "
                             "files only") from None


def _unreadable_file(path: Path) -> str:
    """The first weights file of a local model directory that does not open, with why; '' if all open."""
    from safetensors import safe_open

    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    st.get_slice(k)
        except Exception as err:
            return f"{f}: cannot be read ({str(err).splitlines()[0] if str(err) else type(err).__name__}); " \
                   "truncated or corrupt? Re-save or re-download it"
    return ""


def from_pretrained(load: Callable[..., Any], name: str, what: str = "model", *, is_model: bool = True,
                    **kwargs: Any) -> Any:
    """``load(name, **kwargs)`` (a ``from_pretrained``) with one-line :class:`MutorUserError` failures.
    ``is_model``: a local directory must hold a model (config.json or a peft adapter), not only a tokenizer."""
    name = str(name)
    local = Path(name).expanduser()
    if not local.exists():
        if name.startswith((".", "/", "~")) or name.count("/") > 1:
            raise MutorUserError(f"{what} {name!r} does not exist")
        kwargs = {**hub_probe(name, what), **kwargs}
    elif is_model and local.is_dir() and not kwargs.get("gguf_file") \
            and not any((local / f).is_file() for f in ("config.json", "adapter_config.json")):
        raise MutorUserError(f"{what} {name!r}: this directory holds no model (no config.json or "
                             "adapter_config.json); give a run's directory, one of its checkpoint-N, or a "
                             "transformers model directory")
    from safetensors import SafetensorError

    try:
        return load(name, **kwargs)
    except MutorUserError:
        raise
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        if local.is_dir():
            bad = _unreadable_file(local)
            if bad:
                raise MutorUserError(f"{what} {name!r}: {bad}") from None
        if isinstance(err, (OSError, SafetensorError)):
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise MutorUserError(f"{what} {name!r}: {first}") from None
        raise


@contextlib.contextmanager
def peft_quietly():
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model, which warns
    (removed in transformers v6) on every LoRA run; that one warning, and only it, is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def load_peft_model(adapter_dir, is_trainable: bool = False, **model_kwargs: Any):
    """A ``PeftModel`` for ``adapter_dir`` on its recorded base (:func:`mutor.utils.io.lora_base_dir`)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from .io import lora_base_dir

    base_dir = lora_base_dir(adapter_dir)
    if base_dir is None:
        raise MutorUserError(f"{adapter_dir}: a peft adapter that records no base model (base_model_name_or_path "
                             "is null) and has no base/ directory beside it; load its base yourself and use "
                             "PeftModel.from_pretrained(base, adapter_dir)")
    base = from_pretrained(AutoModelForCausalLM.from_pretrained, str(base_dir), "the adapter's base model",
                           **model_kwargs)
    with peft_quietly():
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=is_trainable)


def did_you_mean(unknown: list[str], known: list[str]) -> str:
    """``'x': did you mean 'y'?`` for each of ``unknown`` close to one of ``known`` ('' when none is)."""
    import difflib

    close = {k: difflib.get_close_matches(str(k), [str(x) for x in known], n=1) for k in unknown}
    return "; ".join(f"{k!r}: did you mean {c[0]!r}?" for k, c in close.items() if c)
