"""The Multi-Token baseline (Gloeckle et al., 2024) as the paper compares it, around an unmodified model.

Gloeckle et al. split the network into a shared trunk and one transformer layer per predicted
offset: the model's own last decoder layer is the next-token head, and ``d_max - 1`` extra
heads, each initialised as a copy of that last layer, predict ``x_{t+k}`` (k = 2..d_max) from
the trunk's output at ``t``. All heads share the model's final norm and output layer (and any
final logit soft-capping, e.g. Gemma 2). The loss is ``(1-a)·L_ntp + a·L_heads``, the same
weighting as MuToR, with ``L_heads`` the token-weighted mean over every head's targets.

What is unusual here: nothing of the modeling code is re-implemented. A forward pre-hook on
the last decoder layer records exactly what that layer receives (the trunk's hidden states and
the attention mask, rotary embeddings, position ids the model prepared for it); each extra head
is then called with the same arguments. Masks for padding, packed documents, sliding windows
and the bidirectional prefix therefore come from the model (or from mutor's mask builder)
exactly as for the next-token head. Families whose causal-LM class exposes ``model.layers``,
``model.norm`` and ``lm_head`` are supported (llama, mistral, qwen2/3, gemma 1/2/3, ...);
others are refused by name.

Heads are training-only: ``save_pretrained`` writes the base model exactly as transformers
(or peft) would, plus a sidecar with the heads so that training can resume.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .config import MuToRConfig
from .io import replace_directory
from .layout import IGNORE_INDEX, build_layout
from .masks import SUPPORTED_ATTENTION, attention_windows, build_attention_mask
from .model import (MuToROutput, _inner_model, check_loss_chunking, load_base_model, prepare_inputs,
                    split_gathered_state_dict)
from .support import check_supported

MT_CONFIG = "multi_token_config.json"
MT_WEIGHTS = "multi_token.safetensors"

__all__ = ["MultiTokenConfig", "MultiTokenModel"]


@dataclass
class MultiTokenConfig:
    d_max: int = field(default=2, metadata={"help": "Largest offset: heads for x_{t+2}..x_{t+d_max} next to the "
                                                    "next-token head (the paper's tuned setting is 2)."})
    loss_weight: float = field(default=0.1, metadata={"help": "a in (1-a)*L_ntp + a*L_heads, in [0, 1) (the "
                                                              "paper's tuned setting is 0.1)."})
    prefix_attention: str = field(default="causal", metadata={"help": "'causal' or 'bidirectional' (prompt tokens "
                                                                      "attend to the whole prompt)."})

    def __post_init__(self) -> None:
        if not (isinstance(self.d_max, int) and not isinstance(self.d_max, bool) and self.d_max >= 2):
            raise ValueError(f"MultiTokenConfig.d_max: must be an integer >= 2 (got {self.d_max!r})")
        if isinstance(self.loss_weight, bool) or not (0.0 <= float(self.loss_weight) < 1.0):
            raise ValueError(f"MultiTokenConfig.loss_weight: must lie in [0, 1) (got {self.loss_weight!r})")
        if self.prefix_attention not in ("causal", "bidirectional"):
            raise ValueError(f"MultiTokenConfig.prefix_attention: must be 'causal' or 'bidirectional' "
                             f"(got {self.prefix_attention!r})")

    @classmethod
    def from_dict(cls, data: dict) -> "MultiTokenConfig":
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"MultiTokenConfig: unknown field(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**data)


def _parts(inner: nn.Module):
    """(decoder layers, final norm, lm_head) of a *ForCausalLM, or a ValueError naming the class."""
    decoder = getattr(inner, "model", None)
    layers = getattr(decoder, "layers", None)
    norm = getattr(decoder, "norm", None)
    head = getattr(inner, "lm_head", None)
    if not isinstance(layers, nn.ModuleList) or norm is None or head is None:
        raise ValueError(f"the Multi-Token baseline supports causal LMs built as model.layers + model.norm + lm_head "
                         f"(llama, mistral, qwen2/3, gemma 1/2/3, ...); {type(inner).__name__} is not")
    return layers, norm, head


def head_target_layout(labels: torch.Tensor, k: int, attention_mask=None, position_ids=None):
    """Where head ``k`` has a target: every ``x_t`` whose ``x_{t+k}`` is supervised and in the same document
    (Gloeckle et al.'s objective, prompt positions included: not MuToR's within-answer register rule),
    as a register layout with offset ``k`` (``reg_source``: the positions, ``reg_labels``: the targets)."""
    head_k = MuToRConfig(d_max=k, min_offset=k, register_placement="supervised_target")
    return build_layout(labels, head_k, attention_mask, position_ids)


class MultiTokenModel(nn.Module):
    """Wrap ``base`` (a transformers causal LM, or a peft model around one) with ``d_max - 1`` extra heads."""

    def __init__(self, base: nn.Module, config: Optional[MultiTokenConfig] = None,
                 loss_chunk_size: Optional[int] = None):
        super().__init__()
        self.multi_token_config = config if config is not None else MultiTokenConfig()
        inner = _inner_model(base)
        check_supported(inner, "the Multi-Token baseline")   # same masks for packing / bidirectional prefix
        layers, _, _ = _parts(inner)
        check_loss_chunking(inner, loss_chunk_size, "MultiTokenModel")
        self.loss_chunk_size = loss_chunk_size
        attn = getattr(inner.config, "_attn_implementation", None) or "eager"
        if self.multi_token_config.prefix_attention == "bidirectional" and attn not in SUPPORTED_ATTENTION:
            raise ValueError(f"{type(inner).__name__} uses attn_implementation={attn!r}, which cannot take the "
                             "bidirectional prefix mask; use sdpa or eager")
        self.windows = attention_windows(inner.config)
        self.base_model = base
        self.heads = nn.ModuleList(copy.deepcopy(layers[-1]) for _ in range(self.multi_token_config.d_max - 1))
        for p in self.heads.parameters():
            p.requires_grad_(True)          # a peft-frozen last layer still gives fully trainable heads

    @property
    def config(self):
        return _inner_model(self.base_model).config

    @property
    def device(self) -> torch.device:
        return next(self.heads.parameters()).device

    def num_added_parameters(self) -> int:
        return sum(p.numel() for p in self.heads.parameters())

    def generate(self, *args, **kwargs):
        return self.base_model.generate(*args, **kwargs)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.base_model.gradient_checkpointing_enable(**kwargs)

    def get_input_embeddings(self) -> nn.Module:
        return self.base_model.get_input_embeddings()

    # ----------------------------------------------------------------- forward
    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + output layer (+ final soft-capping) of the base model, for (N, C) rows."""
        inner = _inner_model(self.base_model)
        _, norm, lm_head = _parts(inner)
        logits = lm_head(norm(hidden))                                                   # (N, V)
        cap = getattr(inner.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[Union[int, torch.Tensor]] = None,
        num_registers_in_batch: Optional[Union[int, torch.Tensor]] = None,
        **kwargs: Any,
    ) -> MuToROutput:
        """``labels`` aligned with ``input_ids`` (-100 where no loss). Head ``k`` at ``t`` targets ``labels[t+k]``
        when it is supervised and in the same document; ``num_registers_in_batch`` is the total head-target count
        of the accumulated batch (the trainer counts it), ``num_items_in_batch`` the next-token count."""
        kwargs.pop("offset_index", None)
        dev = self.device
        input_ids, attention_mask, labels = prepare_inputs(input_ids, attention_mask, labels, position_ids, dev)
        cfg = self.multi_token_config
        base_mask = attention_mask
        if cfg.prefix_attention == "bidirectional":
            prefix = build_layout(labels, MuToRConfig(loss_weight=0.0, prefix_attention="bidirectional"),
                                  attention_mask, position_ids)
            dtype = self.get_input_embeddings().weight.dtype
            base_mask = build_attention_mask(prefix, self.config._attn_implementation or "eager", self.windows, dtype)
            position_ids = prefix.position_ids

        ntp_labels = torch.full_like(labels, IGNORE_INDEX)
        ntp_labels[:, :-1] = labels[:, 1:]                                              # (B, T)
        keep = ntp_labels != IGNORE_INDEX
        inner = _inner_model(self.base_model)
        layers, norm, _ = _parts(inner)
        captured: dict = {}

        def grab(module, args, kw):
            captured["args"], captured["kwargs"] = args, kw

        chunked = self.loss_chunk_size is not None
        handle = layers[-1].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            if chunked:   # decoder only: its (normed) hidden states go to the chunked loss, no logits
                hs = inner.get_decoder()(input_ids=input_ids, attention_mask=base_mask, position_ids=position_ids,
                                         use_cache=False, **kwargs).last_hidden_state   # (B, T, C)
            else:
                out = self.base_model(input_ids=input_ids, attention_mask=base_mask, position_ids=position_ids,
                                      logits_to_keep=keep, use_cache=False, **kwargs)
        finally:
            handle.remove()
        n_ntp = int(keep.sum())
        ntp_den = num_items_in_batch if num_items_in_batch is not None else max(n_ntp, 1)

        args, kw = captured["args"], dict(captured["kwargs"])
        trunk = args[0] if args else kw.pop("hidden_states")                           # (B, T, C)
        rest = args[1:]
        head_rows, head_tgt = [], []
        for k, head in enumerate(self.heads, start=2):
            lay = head_target_layout(labels, k, attention_mask, position_ids)
            h = head(trunk, *rest, **kw)
            h = h[0] if isinstance(h, tuple) else h                                     # (B, T, C)
            head_rows.append(h[torch.arange(h.shape[0], device=dev)[:, None].expand_as(lay.reg_source)[lay.reg_valid],
                               lay.reg_source[lay.reg_valid]])                          # (n_k, C)
            head_tgt.append(lay.reg_labels[lay.reg_valid])                              # (n_k,)
        count_k = [len(t) for t in head_tgt]
        n_aux = sum(count_k)
        aux_den = num_registers_in_batch if num_registers_in_batch is not None else max(n_aux, 1)
        a = cfg.loss_weight
        if chunked:
            from .loss import head_cross_entropy

            rows = torch.cat([hs[keep]] + [norm(r) for r in head_rows])                # (N + n_aux, C)
            targets = torch.cat([ntp_labels[keep]] + head_tgt)
            is_aux = torch.arange(n_ntp + n_aux, device=dev) >= n_ntp
            loss, ce, hit = head_cross_entropy(inner, rows, targets, is_aux, a, ntp_den, aux_den,
                                               self.loss_chunk_size)
            ntp_loss = (ce[:n_ntp].sum() / ntp_den).detach()
            ce_all, ok_all = ce[n_ntp:], hit[n_ntp:].float()
            aux_loss = (ce_all.sum() / aux_den).detach()
        else:
            ntp_ce = F.cross_entropy(out.logits.float(), ntp_labels[keep], reduction="none")  # (N,)
            ntp_loss = ntp_ce.sum() / ntp_den
            ces, oks = [], []
            for rows, tgt in zip(head_rows, head_tgt):
                logits = self._project(rows)                                            # (n_k, V)
                ces.append(F.cross_entropy(logits.float(), tgt, reduction="none"))
                with torch.no_grad():
                    oks.append((logits.gather(1, tgt[:, None]).squeeze(1) >= logits.amax(-1)).float())
            ce_all, ok_all = torch.cat(ces), torch.cat(oks)
            aux_loss = ce_all.sum() / aux_den
            loss = ntp_loss if a == 0 else (1.0 - a) * ntp_loss + a * aux_loss
        with torch.no_grad():
            loss_k = [float(c.sum()) for c in ce_all.detach().split(count_k)]
            acc_k = [float(o.sum()) for o in ok_all.split(count_k)]
        cnt = torch.tensor(count_k, device=dev, dtype=torch.float32)
        den = torch.where(cnt > 0, cnt, torch.nan)          # a head with no target in the batch: NaN, not 0
        return MuToROutput(
            loss=loss, ntp_loss=ntp_loss, reg_loss=aux_loss,
            reg_accuracy=ok_all.sum() / max(n_aux, 1),
            reg_loss_per_offset=torch.tensor(loss_k, device=dev) / den,
            reg_accuracy_per_offset=torch.tensor(acc_k, device=dev) / den,
            reg_count_per_offset=cnt, num_registers=n_aux, num_ntp_tokens=n_ntp,
        )

    # ------------------------------------------------------------ checkpoints
    def save_pretrained(self, save_directory: Union[str, os.PathLike], state_dict: Optional[dict] = None,
                        **kwargs: Any) -> None:
        """The base model's own checkpoint (heads dropped) plus a sidecar with the heads, atomically.

        ``state_dict``: this wrapper's full state dict as FSDP / DeepSpeed ZeRO-3 gather it (keys
        ``base_model.*`` and ``heads.*``); base model and heads are then both written from it, not from
        the live parameters (shards or empty placeholders under those).
        """
        from safetensors.torch import save_file

        if state_dict is None:
            base_sd, heads = None, self.heads.state_dict()
        else:
            names = [f"heads.{k}" for k in self.heads.state_dict()]
            base_sd, own = split_gathered_state_dict(state_dict, "heads.", names, "MultiTokenModel")
            heads = {k[len("heads."):]: v for k, v in own.items()}

        def fill(tmp: Path) -> None:
            self.base_model.save_pretrained(tmp, **({} if base_sd is None else {"state_dict": base_sd}), **kwargs)
            state = {k: v.detach().cpu().contiguous() for k, v in heads.items()}
            save_file(state, str(tmp / MT_WEIGHTS), metadata={"format": "pt", "library": "mutor"})
            (tmp / MT_CONFIG).write_text(json.dumps(asdict(self.multi_token_config), indent=2) + "\n")

        replace_directory(save_directory, fill)

    def load_sidecar(self, path: Union[str, os.PathLike]) -> None:
        from safetensors.torch import load_file

        state = load_file(str(Path(path) / MT_WEIGHTS))
        missing, unexpected = self.heads.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{Path(path) / MT_WEIGHTS} does not fit these heads: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike], base: Optional[nn.Module] = None,
                        loss_chunk_size: Optional[int] = None, **model_kwargs: Any) -> "MultiTokenModel":
        """Restore a checkpoint saved by :meth:`save_pretrained` (a peft adapter directory works too);
        ``loss_chunk_size`` is the constructor's (not saved), ``model_kwargs`` go to the base's ``from_pretrained``."""
        path = Path(path)
        for f in (MT_CONFIG, MT_WEIGHTS):
            if not (path / f).is_file():
                raise FileNotFoundError(f"{path} has no {f}: not a checkpoint written by MultiTokenModel")
        config = MultiTokenConfig.from_dict(json.loads((path / MT_CONFIG).read_text()))
        if base is None:
            base = load_base_model(path, **model_kwargs)
        model = cls(base, config, loss_chunk_size=loss_chunk_size)
        model.load_sidecar(path)
        return model
