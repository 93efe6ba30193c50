"""MuToRModel: the register objective around any transformers causal LM, unmodified.

Nothing of the base model is forked or patched. One forward pass:

1. ``layout.build_layout`` samples an offset per row and decides every register;
2. token embeddings come from the model's own input embedding (so Gemma's
   sqrt(hidden) scaling and LoRA on embeddings apply), register vectors from
   ``register_embeddings``; both are concatenated into ``inputs_embeds``;
3. ``masks.build_attention_mask`` turns the layout into the mask the model's
   attention backend needs, and explicit ``position_ids`` carry the offsets; under
   ``sdpa`` the register rows are computed apart from the regular ones
   (:mod:`mutor.attention`), so the unused register-register block costs nothing;
4. the base model runs with a boolean ``logits_to_keep`` so the vocabulary
   projection (and any model-specific logit processing, e.g. Gemma 2
   soft-capping) is done only at rows that carry a loss.

Registers never reach the saved checkpoint: ``save_pretrained`` writes the base
model exactly as transformers/peft would, plus a sidecar (``mutor.safetensors``,
``mutor_config.json``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .attention import split_attention_for
from .config import SIDECAR_CONFIG, MuToRConfig
from .io import replace_directory
from .layout import IGNORE_INDEX, RegisterLayout, build_layout
from .masks import SUPPORTED_ATTENTION, attention_windows, build_attention_mask
from .support import check_supported

SIDECAR_WEIGHTS = "mutor.safetensors"


@dataclass
class MuToROutput(ModelOutput):
    """What a MuToR forward returns. Per-offset tensors follow ``config.offset_choices()``; an offset with
    no register in the batch (``reg_count_per_offset`` 0) has NaN loss and accuracy, not 0."""

    loss: Optional[torch.Tensor] = None
    ntp_loss: Optional[torch.Tensor] = None
    reg_loss: Optional[torch.Tensor] = None
    reg_accuracy: Optional[torch.Tensor] = None
    reg_loss_per_offset: Optional[torch.Tensor] = None
    reg_accuracy_per_offset: Optional[torch.Tensor] = None
    reg_count_per_offset: Optional[torch.Tensor] = None
    num_registers: Optional[int] = None
    num_ntp_tokens: Optional[int] = None
    logits: Optional[torch.Tensor] = None
    layout: Optional[RegisterLayout] = None


def _inner_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def prepare_inputs(input_ids, attention_mask, labels, position_ids, device):
    """Check shapes, move to ``device``; labels default to every non-padding token."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    for name, t in (("attention_mask", attention_mask), ("position_ids", position_ids), ("labels", labels)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; it must match input_ids {tuple(input_ids.shape)}")
    input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    if labels is None:
        labels = input_ids if attention_mask is None else input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return input_ids, attention_mask, labels.to(device)


def _accepts(fn, name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_loss_chunking(inner: nn.Module, loss_chunk_size: Optional[int], owner: str) -> None:
    """A ValueError unless ``loss_chunk_size`` is None, or a positive int on a model whose logits are
    ``lm_head(decoder(...).last_hidden_state)`` (a plain nn.Linear, no logit scaling) - what the
    chunked loss (mutor.loss) recomputes."""
    if loss_chunk_size is None:
        return
    if isinstance(loss_chunk_size, bool) or not isinstance(loss_chunk_size, int) or loss_chunk_size < 1:
        raise ValueError(f"{owner} loss_chunk_size must be None or a positive integer, got {loss_chunk_size!r}")
    name, hf_config = type(inner).__name__, getattr(inner, "config", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    odd = [k for k in ("logit_scale", "logits_scaling", "output_multiplier_scale") if getattr(hf_config, k, None)]
    if type(head) is not nn.Linear or odd or not hasattr(inner, "get_decoder"):
        raise ValueError(f"{name}: loss_chunk_size needs a plain nn.Linear output layer and no logit scaling "
                         f"(found {type(head).__name__}{', ' + ', '.join(odd) if odd else ''}); "
                         "use loss_chunk_size=None (logits through the model's own head)")


def split_gathered_state_dict(state_dict: dict, own_prefix: str, own_keys: list[str],
                              owner: str) -> tuple[dict, dict]:
    """Split a wrapper's full state dict (what FSDP / DeepSpeed ZeRO-3 gather for saving) in two.

    Returns the base model's part with the ``base_model.`` prefix stripped (so it saves as a vanilla
    transformers / peft checkpoint) and the wrapper's own part (``own_keys``, all under ``own_prefix``).
    A tensor that is still a sharded DTensor, a missing wrapper key or a key of neither part is an error:
    writing it would give a checkpoint with a shard or a placeholder in it.
    """
    base, own, stray = {}, {}, []
    for k, v in state_dict.items():
        if type(v).__name__ == "DTensor":
            raise ValueError(f"{owner}.save_pretrained: state_dict[{k!r}] is a sharded DTensor, not a gathered "
                             "tensor; pass the full state dict (FSDP state_dict_type FULL_STATE_DICT)")
        if k.startswith("base_model."):
            base[k[len("base_model."):]] = v
        elif k.startswith(own_prefix):
            own[k] = v
        else:
            stray.append(k)
    missing = [k for k in own_keys if k not in own] + ([] if base else ["base_model.*"])
    unexpected = stray + [k for k in own if k not in own_keys]
    if missing or unexpected:
        raise ValueError(f"{owner}.save_pretrained: state_dict is not this wrapper's full state dict: "
                         f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    return base, own


def load_base_model(path: Path, **model_kwargs: Any) -> nn.Module:
    """The base model of a wrapper checkpoint: a peft adapter on its recorded base (a saved random init
    too), trainable, or else a plain transformers checkpoint."""
    if (path / "adapter_config.json").is_file():
        from .errors import load_peft_model

        return load_peft_model(path, is_trainable=True, **model_kwargs)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), **model_kwargs)


class MuToRModel(nn.Module):
    """Wrap ``base`` (a transformers ``*ForCausalLM`` or a peft model around one) for MuToR training."""

    def __init__(self, base: nn.Module, config: Optional[MuToRConfig] = None, attention: str = "auto",
                 loss_chunk_size: Optional[int] = None):
        super().__init__()
        if attention not in ("auto", "dense"):
            raise ValueError(f"MuToRModel attention must be 'auto' (split register rows under sdpa) or 'dense' "
                             f"(one (T+R)x(T+R) mask), got {attention!r}")
        self.attention = attention
        self.loss_chunk_size = loss_chunk_size
        self.mutor_config = config if config is not None else MuToRConfig()
        inner = _inner_model(base)
        name = type(inner).__name__
        hf_config = getattr(inner, "config", None)
        if hf_config is None or not hasattr(inner, "get_input_embeddings"):
            raise TypeError(f"{name} is not a transformers PreTrainedModel; MuToRModel wraps *ForCausalLM models")
        check_supported(inner)  # ALiBi, state-space / recurrent and chunked-attention families (mutor.support)
        for arg in ("inputs_embeds", "position_ids", "attention_mask"):
            if not _accepts(inner.forward, arg):
                raise TypeError(f"{name}.forward does not accept `{arg}`; MuToR injects registers through "
                                "inputs_embeds and position_ids with a custom attention mask, so it needs a model "
                                "whose forward takes them (most transformers causal LMs do)")
        attn = getattr(hf_config, "_attn_implementation", None) or "eager"
        if attn not in SUPPORTED_ATTENTION:
            raise ValueError(f"{name} uses attn_implementation={attn!r}, which cannot take MuToR's custom attention "
                             f"mask; load the model with attn_implementation='sdpa' (or 'eager', or "
                             f"'flex_attention' on GPU)")
        self.windows = attention_windows(hf_config)  # raises for chunked / linear attention layers
        self._logits_to_keep = "logits_to_keep" in inspect.signature(inner.forward).parameters
        check_loss_chunking(inner, loss_chunk_size, "MuToRModel")
        self.base_model = base

        emb = base.get_input_embeddings()
        hidden = emb.weight.shape[1]
        self.register_embeddings = nn.Embedding(
            self.mutor_config.num_register_embeddings, hidden, device=emb.weight.device, dtype=emb.weight.dtype)
        self._generator = None
        if self.mutor_config.seed is not None:
            self._generator = torch.Generator().manual_seed(self.mutor_config.seed)
        self._init_registers(emb)

    # ------------------------------------------------------------------ set-up
    @torch.no_grad()
    def _init_registers(self, emb: nn.Module) -> None:
        """Normal init with the per-coordinate std of embedded tokens (after any model-side scaling)."""
        vocab = emb.weight.shape[0]
        ids = torch.linspace(0, vocab - 1, min(vocab, 4096), device=emb.weight.device).long()
        std = emb(ids[None]).float().std().item()                                      # (1, n, C) -> scalar
        w = torch.randn(self.register_embeddings.weight.shape, generator=self._generator) * std
        self.register_embeddings.weight.copy_(w.to(self.register_embeddings.weight))

    @property
    def config(self):
        """The base model's transformers config (so tooling that reads ``model.config`` keeps working)."""
        return _inner_model(self.base_model).config

    @property
    def attn_implementation(self) -> str:
        return self.config._attn_implementation or "eager"

    @property
    def device(self) -> torch.device:
        return self.register_embeddings.weight.device

    def generate(self, *args, **kwargs):
        """Plain generation with the base model: registers play no part at inference."""
        return self.base_model.generate(*args, **kwargs)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.base_model.gradient_checkpointing_enable(**kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.base_model.gradient_checkpointing_disable()

    def get_input_embeddings(self) -> nn.Module:
        return self.base_model.get_input_embeddings()

    def rng_state(self) -> Optional[torch.Tensor]:
        """State of the private offset generator (None when the global RNG is used)."""
        return None if self._generator is None else self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        if self._generator is None:
            raise ValueError("this MuToRModel has no private generator (MuToRConfig.seed is None)")
        self._generator.set_state(state)

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        offset_index: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[Union[int, torch.Tensor]] = None,
        num_registers_in_batch: Optional[Union[int, torch.Tensor]] = None,
        return_logits: bool = False,
        **kwargs: Any,
    ) -> MuToROutput:
        """One training forward.

        ``labels`` are aligned with ``input_ids`` (-100 on prompt and padding), as for a plain
        causal LM; None means every non-padding token. ``position_ids`` mark packed documents.
        ``offset_index`` (B,) overrides the sampled offsets (indices into ``offset_choices()``).
        ``num_items_in_batch`` / ``num_registers_in_batch`` replace the per-batch denominators
        of the two losses (token-weighted means under gradient accumulation).
        """
        input_ids, attention_mask, labels = prepare_inputs(input_ids, attention_mask, labels, position_ids, self.device)
        dev = self.device
        cfg = self.mutor_config
        layout = build_layout(labels, cfg, attention_mask, position_ids, offset_index, self._generator)

        tok = self.base_model.get_input_embeddings()(input_ids)                          # (B, T, C)
        rows = layout.reg_choice if cfg.register_embedding == "per_offset" else torch.zeros_like(layout.reg_choice)
        reg = self.register_embeddings(rows).to(tok.dtype)                                # (B, R, C)
        inputs_embeds = torch.cat([tok, reg], dim=1)                                      # (B, T+R, C)
        mask = build_attention_mask(layout, self.attn_implementation, self.windows, inputs_embeds.dtype)

        targets = torch.cat([layout.ntp_labels, layout.reg_labels], 1)                   # (B, T+R)
        keep = targets != IGNORE_INDEX                                                    # (B, T+R)
        is_reg = torch.cat([torch.zeros_like(layout.ntp_labels, dtype=torch.bool), layout.reg_valid], 1)[keep]
        if self._logits_to_keep and self.loss_chunk_size is None:
            kwargs["logits_to_keep"] = keep
        inner = _inner_model(self.base_model)
        # gradient checkpointing recomputes layers outside this forward, where the split is off: keep it dense
        checkpointing = self.training and any(getattr(m, "gradient_checkpointing", False) for m in inner.modules())
        split = (self.attention == "auto" and self.attn_implementation == "sdpa" and layout.num_slots > 0
                 and not checkpointing)
        ctx = split_attention_for(inner, layout.num_regular, mask) if split \
            else contextlib.nullcontext()
        targets = targets[keep]                                                            # (N,)
        n_ntp = int((~is_reg).sum())
        n_reg = int(is_reg.sum())
        ntp_den = num_items_in_batch if num_items_in_batch is not None else max(n_ntp, 1)
        reg_den = num_registers_in_batch if num_registers_in_batch is not None else max(n_reg, 1)
        a = cfg.loss_weight
        logits = None
        if self.loss_chunk_size is None:
            with ctx:
                out = self.base_model(inputs_embeds=inputs_embeds, attention_mask=mask,
                                      position_ids=layout.position_ids, use_cache=False, **kwargs)
            logits = out.logits if self._logits_to_keep else out.logits[keep]             # (N, V)
            ce = F.cross_entropy(logits.float(), targets, reduction="none")               # (N,)
            ntp_loss = ce[~is_reg].sum() / ntp_den
            reg_loss = ce[is_reg].sum() / reg_den
            loss = ntp_loss if a == 0 else (1.0 - a) * ntp_loss + a * reg_loss
            with torch.no_grad():
                # top-1 without copying the register rows out of the (N, V) logits (ties count as correct)
                target_logit = logits.gather(1, targets[:, None]).squeeze(1)              # (N,)
                hit = target_logit >= logits.amax(-1)
        else:
            loss, ce, hit = self._chunked_loss(inputs_embeds, mask, layout.position_ids, keep, targets, is_reg,
                                               ntp_den, reg_den, ctx, kwargs)
            ntp_loss = (ce[~is_reg].sum() / ntp_den).detach()
            reg_loss = (ce[is_reg].sum() / reg_den).detach()
        ce_reg = ce[is_reg]                                                                # (n_reg,)

        with torch.no_grad():
            K = len(cfg.offset_choices())
            choice = layout.reg_choice[layout.reg_valid]          # same row-major order as the register rows
            correct = hit[is_reg].float()
            count_k = torch.bincount(choice, minlength=K).float()
            loss_k = torch.zeros(K, device=dev).index_add_(0, choice, ce_reg.detach())
            acc_k = torch.zeros(K, device=dev).index_add_(0, choice, correct)
            denom_k = torch.where(count_k > 0, count_k, torch.nan)   # no register of an offset: NaN, not 0
        return MuToROutput(
            loss=loss, ntp_loss=ntp_loss, reg_loss=reg_loss,
            reg_accuracy=correct.sum() / max(n_reg, 1),
            reg_loss_per_offset=loss_k / denom_k, reg_accuracy_per_offset=acc_k / denom_k,
            reg_count_per_offset=count_k, num_registers=n_reg, num_ntp_tokens=n_ntp,
            logits=logits if return_logits else None, layout=layout if return_logits else None,
        )

    def _chunked_loss(self, inputs_embeds, mask, position_ids, keep, targets, is_reg, ntp_den, reg_den, ctx, kwargs):
        """Decoder hidden states at loss rows, then projection + cross-entropy in chunks (mutor.loss)."""
        from .loss import head_cross_entropy

        inner = _inner_model(self.base_model)
        with ctx:
            hs = inner.get_decoder()(inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids,
                                     use_cache=False, **kwargs).last_hidden_state                # (B, L, C)
        return head_cross_entropy(inner, hs[keep], targets, is_reg, self.mutor_config.loss_weight, ntp_den,
                                  reg_den, self.loss_chunk_size)

    # ------------------------------------------------------------ checkpoints
    def save_pretrained(self, save_directory: Union[str, os.PathLike], state_dict: Optional[dict] = None,
                        **kwargs: Any) -> None:
        """Write the base model's own checkpoint plus the mutor sidecar, atomically.

        Everything goes to a temporary sibling directory first, which then replaces
        ``save_directory``: a crash never leaves a half-written checkpoint behind.
        ``state_dict``: this wrapper's full state dict as FSDP / DeepSpeed ZeRO-3 gather it (keys
        ``base_model.*`` and ``register_embeddings.weight``). Under those the live parameters are shards
        or empty placeholders, so base model and sidecar are then both written from it.
        """
        from safetensors.torch import save_file

        if state_dict is None:
            base_sd, own = None, {"register_embeddings.weight": self.register_embeddings.weight}
        else:
            base_sd, own = split_gathered_state_dict(state_dict, "register_embeddings.",
                                                     ["register_embeddings.weight"], "MuToRModel")

        def fill(tmp: Path) -> None:
            self.base_model.save_pretrained(tmp, **({} if base_sd is None else {"state_dict": base_sd}), **kwargs)
            tensors = {k: v.detach().cpu().contiguous() for k, v in own.items()}
            if self._generator is not None:
                tensors["generator_state"] = self._generator.get_state()
            save_file(tensors, str(tmp / SIDECAR_WEIGHTS), metadata={"format": "pt", "library": "mutor"})
            (tmp / SIDECAR_CONFIG).write_text(self.mutor_config.to_json_string())

        replace_directory(save_directory, fill)

    def load_sidecar(self, path: Union[str, os.PathLike]) -> None:
        """Load register embeddings (and the offset generator's state) from a checkpoint directory.

        The base model's weights are not touched: ``Trainer`` resumes them from the vanilla
        checkpoint itself; this restores what only mutor knows.
        """
        from safetensors.torch import load_file

        path = Path(path)
        state = load_file(str(path / SIDECAR_WEIGHTS))
        weight = state["register_embeddings.weight"]
        if weight.shape != self.register_embeddings.weight.shape:
            raise ValueError(f"{path / SIDECAR_WEIGHTS}: register embeddings of shape {tuple(weight.shape)} do not "
                             f"fit this model's {tuple(self.register_embeddings.weight.shape)}")
        with torch.no_grad():
            self.register_embeddings.weight.copy_(weight)
        if "generator_state" in state and self._generator is not None:
            self._generator.set_state(state["generator_state"])

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike], base: Optional[nn.Module] = None,
                        attention: str = "auto", loss_chunk_size: Optional[int] = None,
                        **model_kwargs: Any) -> "MuToRModel":
        """Restore a MuToRModel saved by :meth:`save_pretrained` (a peft adapter directory works too).

        ``attention`` and ``loss_chunk_size`` are the constructor's (they are not saved: they change how
        the loss is computed, not what is learned); ``model_kwargs`` go to the base model's ``from_pretrained``.
        """
        path = Path(path)
        for f in (SIDECAR_CONFIG, SIDECAR_WEIGHTS):
            if not (path / f).is_file():
                raise FileNotFoundError(f"{path} has no {f}: not a checkpoint written by MuToRModel.save_pretrained "
                                        "(a plain transformers checkpoint loads with AutoModelForCausalLM)")
        config = MuToRConfig.from_dict(json.loads((path / SIDECAR_CONFIG).read_text()))
        if base is None:
            base = load_base_model(path, **model_kwargs)
        model = cls(base, config, attention=attention, loss_chunk_size=loss_chunk_size)
        model.load_sidecar(path)
        return model
