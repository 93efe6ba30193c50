"""What a method's checkpoint is: the base model exactly as transformers / peft saves it, plus a sidecar.

``save_pretrained`` writes the base model as transformers (or peft) would, so the directory loads with
``AutoModelForCausalLM.from_pretrained`` (or peft) without mutor, and beside it the method's sidecar: its
config (``config_file``) and, for a method with parameters of its own, a safetensors file (``weights_file``)
with them and the offset generator's state. ``load_sidecar`` and ``from_pretrained`` read it back.

What is unusual:

* Everything is written to a temporary sibling directory, which then replaces the destination
  (:func:`mutor.utils.io.replace_directory`): a crash never leaves a half-written checkpoint behind.
  :func:`save_wrapper_into` instead moves the files one by one into a directory that Trainer also fills.
* Under FSDP / DeepSpeed ZeRO-3 the live parameters are shards or empty placeholders, so both parts are
  written from the full state dict Trainer gathers (:func:`split_gathered_state_dict`), never from the
  parameters themselves.
* A sidecar config written before a field existed reads back with the value its writer meant
  (``sidecar_defaults`` of the config class).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, TypeVar, Union

from torch import nn

from ..models.loading import load_base_model
from ..utils.io import replace_directory

__all__ = ["SidecarCheckpoint", "save_wrapper_into", "split_gathered_state_dict"]

_Wrapper = TypeVar("_Wrapper", bound="SidecarCheckpoint")


def split_gathered_state_dict(state_dict: dict, own_keys: list[str], owner: str) -> tuple[dict, dict]:
    """Split a wrapper's full state dict (what FSDP / DeepSpeed ZeRO-3 gather for saving) in two.

    Args:
        state_dict: The gathered state dict (``base_model.*`` and the wrapper's own keys).
        own_keys: The wrapper's own keys.
        owner: The wrapper's class name, for the messages.

    Returns:
        The base model's part with the ``base_model.`` prefix stripped (so it saves as a vanilla transformers /
        peft checkpoint) and the wrapper's own part (``own_keys``).

    Raises:
        ValueError: A tensor that is still a sharded DTensor, a missing wrapper key or a key of neither part:
            writing it would give a checkpoint with a shard or a placeholder in it.
    """
    base, own, stray = {}, {}, []
    for k, v in state_dict.items():
        if type(v).__name__ == "DTensor":
            raise ValueError(f"{owner}.save_pretrained: state_dict[{k!r}] is a sharded DTensor, not a gathered "
                             "tensor; pass the full state dict (FSDP state_dict_type FULL_STATE_DICT)")
        if k.startswith("base_model."):
            base[k[len("base_model."):]] = v
        elif k in own_keys:
            own[k] = v
        else:
            stray.append(k)
    missing = [k for k in own_keys if k not in own] + ([] if base else ["base_model.*"])
    if missing or stray:
        raise ValueError(f"{owner}.save_pretrained: state_dict is not this wrapper's full state dict: "
                         f"missing {missing[:3]}, unexpected {stray[:3]}")
    return base, own


class SidecarCheckpoint:
    """Mixin of :class:`~mutor.methods.base.TrainingWrapper`: saving and restoring a wrapper as base model + sidecar.

    The host is an ``nn.Module`` with ``base_model``, ``method_config`` (the config the sidecar holds) and
    ``rng_state`` / ``set_rng_state`` (its offset generator, if any); a subclass names its files.
    """

    config_file: str = ""                     # the sidecar's config file (the method's config as JSON)
    config_class: type = type(None)
    weights_file: Optional[str] = None        # the wrapper's own parameters (None: it has none)
    sidecar_prefix: str = ""                  # dropped from the state-dict keys in the weights file
    options: tuple[str, ...] = ("loss_chunk_size",)   # constructor arguments that are not saved

    def _own_state(self) -> dict:
        """The wrapper's own parameters (and buffers), under their state-dict names."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("base_model.")}

    def save_pretrained(self, save_directory: Union[str, os.PathLike], state_dict: Optional[dict] = None,
                        **kwargs: Any) -> None:
        """Write the base model's own checkpoint plus the sidecar, atomically.

        The base model is saved exactly as transformers / peft would save it, so the directory loads with
        ``AutoModelForCausalLM.from_pretrained`` (or peft) without mutor; the sidecar (``config_file``, and
        ``weights_file`` for a wrapper with parameters of its own) is what :meth:`from_pretrained` reads back.
        Everything goes to a temporary sibling directory first, which then replaces ``save_directory``: a crash
        never leaves a half-written checkpoint behind.

        Args:
            save_directory: The checkpoint directory; replaced if it exists.
            state_dict: This wrapper's full state dict as FSDP / DeepSpeed ZeRO-3 gather it (``base_model.*``
                and the wrapper's own keys); under those the parameters held by each process are shards or
                empty placeholders, so both parts are written from it. None: the parameters themselves.
            **kwargs: Passed on to the base model's ``save_pretrained``.

        Raises:
            ValueError: ``state_dict`` is not this wrapper's full, gathered state dict.
        """
        from safetensors.torch import save_file

        own = self._own_state()
        base_sd = None
        if state_dict is not None:
            base_sd, own = split_gathered_state_dict(state_dict, list(own), type(self).__name__)

        def fill(tmp: Path) -> None:
            self.base_model.save_pretrained(tmp, **({} if base_sd is None else {"state_dict": base_sd}), **kwargs)
            n = len(self.sidecar_prefix)
            tensors = {k[n:]: v.detach().cpu().contiguous() for k, v in own.items()}
            if self.rng_state() is not None:
                tensors["generator_state"] = self.rng_state()
            if self.weights_file is not None:
                save_file(tensors, str(tmp / self.weights_file), metadata={"format": "pt", "library": "mutor"})
            (tmp / self.config_file).write_text(self.method_config.to_json_string())

        replace_directory(save_directory, fill)

    def load_sidecar(self, path: Union[str, os.PathLike], parameters: bool = True) -> None:
        """Load what only mutor knows from a checkpoint directory.

        The base model's weights are not touched (Trainer resumes them from the vanilla checkpoint).

        Args:
            path: A directory written by :meth:`save_pretrained`.
            parameters: Load the wrapper's own parameters; False: only the offset generator's state (e.g. after
                FSDP loaded the whole wrapper).

        Raises:
            ValueError: The saved parameters do not fit this wrapper (missing, unexpected or reshaped).
        """
        from safetensors.torch import load_file

        if self.weights_file is None:
            return
        file = Path(path) / self.weights_file
        state = load_file(str(file))
        generator = state.pop("generator_state", None)
        state = {self.sidecar_prefix + k: v for k, v in state.items()}
        if parameters:
            own = self._own_state()
            missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            wrong = [k for k in own if k in state and state[k].shape != own[k].shape]
            if missing or unexpected or wrong:
                shapes = ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in wrong[:3])
                raise ValueError(f"{file} does not fit this {type(self).__name__}: missing {missing[:3]}, "
                                 f"unexpected {unexpected[:3]}" + (f", shapes {shapes}" if wrong else ""))
            self.load_state_dict(state, strict=False)
        if generator is not None and self.rng_state() is not None:
            self.set_rng_state(generator)

    @classmethod
    def from_pretrained(cls: type[_Wrapper], path: Union[str, os.PathLike], base: Optional[nn.Module] = None,
                        **kwargs: Any) -> _Wrapper:
        """Restore a wrapper saved by :meth:`save_pretrained` (a peft adapter directory works too).

        Args:
            path: The checkpoint directory.
            base: The base model, already loaded; None: loaded from ``path`` (a peft adapter on its recorded
                base, trainable, or a plain transformers checkpoint: :func:`mutor.models.loading.load_base_model`).
            **kwargs: The constructor's ``options`` (e.g. ``loss_chunk_size``: not saved, since they change how
                the loss is computed, not what is learned); the rest go to the base model's ``from_pretrained``.

        Returns:
            The wrapper, with its config, own parameters and offset generator state as saved.

        Raises:
            FileNotFoundError: ``path`` lacks the wrapper's sidecar files (e.g. a plain transformers checkpoint).
        """
        path = Path(path)
        for f in (cls.config_file, cls.weights_file):
            if f is not None and not (path / f).is_file():
                raise FileNotFoundError(f"{path} has no {f}: not a checkpoint written by {cls.__name__}."
                                        "save_pretrained (a plain transformers checkpoint loads with "
                                        "AutoModelForCausalLM)")
        options = {k: kwargs.pop(k) for k in cls.options if k in kwargs}
        config = cls.config_class.from_dict({**cls.config_class.sidecar_defaults,
                                               **json.loads((path / cls.config_file).read_text())})
        if base is None:
            base = load_base_model(path, **kwargs)
        model = cls(base, config, **options)
        model.load_sidecar(path)
        return model


def save_wrapper_into(wrapper: nn.Module, output_dir: str, state_dict: Optional[dict] = None) -> None:
    """``wrapper.save_pretrained`` into an existing directory without disturbing what else is there.

    The wrapper writes a complete checkpoint into a temporary sibling; each file is then renamed
    into ``output_dir`` (one atomic rename per file), so a checkpoint directory that Trainer also
    fills (optimizer, RNG state, trainer_state.json) or a run directory with logs is never replaced.

    Args:
        wrapper: The wrapper to save.
        output_dir: The directory to add its files to (created if missing).
        state_dict: The gathered state dict under FSDP / DeepSpeed ZeRO-3 (:meth:`SidecarCheckpoint.save_pretrained`).
    """
    dest = Path(output_dir)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.save-", dir=dest.parent))
    try:
        kwargs = {} if state_dict is None else {"state_dict": state_dict}
        wrapper.save_pretrained(tmp / "m", **kwargs)
        for f in sorted((tmp / "m").rglob("*")):
            if f.is_file():
                target = dest / f.relative_to(tmp / "m")
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
