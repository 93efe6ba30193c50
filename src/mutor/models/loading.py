"""Loading models: every ``from_pretrained`` of mutor goes through here, with one-line failures.

What is unusual here:

* :func:`from_pretrained` asks the Hugging Face Hub once, with a short timeout, before a Hub id
  is loaded. Without it, an offline machine spends 30-50 s in ``huggingface_hub``'s retries
  and ends in a long traceback; with it, the failure is one :class:`~mutor.utils.errors.MutorUserError`
  line after one attempt. A Hub id already in the local cache then loads from the cache
  (``local_files_only``). A local file that cannot be read (a truncated ``model.safetensors``) is
  named in the error.
* :func:`load_peft_model` loads a peft adapter directory on the base its run recorded, including
  the random-init base that ``mutor train`` saves beside a LoRA adapter (``base/``), which
  peft alone would look for on the Hub; :func:`load_base_model` is what a method's checkpoint
  holds besides its sidecar (an adapter, or a plain transformers model).
* The dtype a command or recipe names (:data:`DTYPES`, :func:`resolve_dtype`) and the attention
  backend a recipe names are turned into ``from_pretrained`` arguments here, once
  (:func:`load_pretrained`, :func:`load_causal_lm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ..utils.devices import resolve_device
from ..utils.errors import MutorUserError
from ..utils.hub import HUB_PROBE_TIMEOUT_S, is_offline
from ..utils.io import lora_base_dir
from .peft_utils import peft_quietly

__all__ = ["DTYPES", "TORCH_DTYPES", "from_pretrained", "hub_probe", "load_base_model", "load_causal_lm",
           "load_peft_model", "load_pretrained", "resolve_dtype"]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPES = ("auto", *TORCH_DTYPES)           # "auto": the checkpoint's own


def resolve_dtype(dtype: Optional[str] = "auto") -> Union[str, torch.dtype]:
    """``"auto"`` (the checkpoint's own dtype) or the ``torch.dtype`` named by one of :data:`DTYPES`.

    Args:
        dtype: ``"auto"``, None (the same) or a name in :data:`TORCH_DTYPES`.

    Returns:
        ``"auto"`` or the ``torch.dtype``.

    Raises:
        ValueError: Any other name.
    """
    if dtype is None or dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    return TORCH_DTYPES[dtype]


# ------------------------------------------------------------------ one-line failures
def hub_probe(name: str, what: str) -> dict:
    """Extra ``from_pretrained`` kwargs for Hub id ``name``, after one quick question to the Hub.

    Args:
        name: The Hub id.
        what: What the user called it (``"model.name_or_path"``, ``"--model"``), for the message.

    Returns:
        ``{}`` when the Hub is reachable and the repository exists (or is gated: ``from_pretrained`` then gives
        its own message about the token, or ``HF_HUB_OFFLINE`` is set); ``{"local_files_only": True}`` when the
        Hub is unreachable and the id is in the local cache.

    Raises:
        MutorUserError: The repository does not exist, or the Hub is unreachable and the id is not cached.
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

    Args:
        load: The loader, e.g. ``AutoModelForCausalLM.from_pretrained`` or ``AutoTokenizer.from_pretrained``.
        name: A local path or a Hub id.
        what: What the user called it, for the messages.
        is_model: A local directory must hold a model (config.json or a peft adapter), not only a tokenizer.
        **kwargs: Passed on to ``load``.

    Returns:
        What ``load`` returns.

    Raises:
        MutorUserError: A missing path, a directory with no model, an unreachable or unknown Hub id, an
            unreadable weights file, or the loader's own ``OSError``, in one line.
    """
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


# ------------------------------------------------------------------ the loaders
def load_pretrained(name: str, dtype: str = "float32", attn_implementation: str = "sdpa",
                    what: str = "model.name_or_path") -> nn.Module:
    """A recipe's pretrained causal LM: ``AutoModelForCausalLM.from_pretrained`` with one-line failures.

    Args:
        name: A local directory or a Hub id.
        dtype: A name in :data:`TORCH_DTYPES` (the recipe's ``model.dtype``).
        attn_implementation: The attention backend (``sdpa``, ``eager``, ``flex_attention``).
        what: What the user called it, for the messages.

    Returns:
        The model, in ``dtype``, on the CPU.
    """
    from transformers import AutoModelForCausalLM

    return from_pretrained(AutoModelForCausalLM.from_pretrained, name, what, dtype=TORCH_DTYPES[dtype],
                           attn_implementation=attn_implementation)


def load_causal_lm(path, device: Optional[Union[str, torch.device]] = None, dtype: Optional[str] = "auto"):
    """``AutoModelForCausalLM.from_pretrained(path)`` in ``dtype`` (:func:`resolve_dtype`), on ``device``
    (:func:`mutor.utils.devices.resolve_device`: the first GPU when there is one), in eval mode."""
    from transformers import AutoModelForCausalLM

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dt).to(dev).eval()


def load_peft_model(adapter_dir, is_trainable: bool = False, **model_kwargs: Any):
    """A ``PeftModel`` for ``adapter_dir`` on its recorded base (:func:`mutor.utils.io.lora_base_dir`).

    Args:
        adapter_dir: A peft adapter directory (a LoRA run, or one of its checkpoints).
        is_trainable: Load the adapter trainable (resuming) rather than frozen (inference).
        **model_kwargs: Passed on to the base model's ``from_pretrained`` (e.g. ``dtype``).

    Returns:
        The ``PeftModel``.

    Raises:
        MutorUserError: The adapter records no base and has no ``base/`` beside it, or the base fails to load.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = lora_base_dir(adapter_dir)
    if base_dir is None:
        raise MutorUserError(f"{adapter_dir}: a peft adapter that records no base model (base_model_name_or_path "
                             "is null) and has no base/ directory beside it; load its base yourself and use "
                             "PeftModel.from_pretrained(base, adapter_dir)")
    base = from_pretrained(AutoModelForCausalLM.from_pretrained, str(base_dir), "the adapter's base model",
                           **model_kwargs)
    with peft_quietly():
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=is_trainable)


def load_base_model(path: Path, **model_kwargs: Any) -> nn.Module:
    """The base model of a method's checkpoint: a peft adapter on its recorded base (a saved random init
    too), trainable, or else a plain transformers checkpoint.

    Args:
        path: The checkpoint directory.
        **model_kwargs: Passed on to ``from_pretrained``.

    Returns:
        The model (a ``PeftModel`` for an adapter directory).
    """
    if (Path(path) / "adapter_config.json").is_file():
        return load_peft_model(path, is_trainable=True, **model_kwargs)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), **model_kwargs)
