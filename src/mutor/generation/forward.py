"""The model side of a drafting round: one forward of the fed tokens and their registers, and the cache.

Each forward feeds ``[pending tokens, draft]`` and K-1 registers after each chosen token, registers at position
``t+d-1`` attending to what their token sees and to themselves (the training rule, ``core/layout.py``). Regular
tokens never see registers, so the regular logits are those of the plain model. The cache is a plain
``DynamicCache`` of full layers (sliding windows are applied through the mask on position ids, as in training),
made here so that no layer evicts entries on its own; after each round it is cropped to the kept regular tokens,
so register keys and values never stay in it. Eager and sdpa attention (a FlexAttention BlockMask cannot be
sliced to the new rows).

What is unusual: in float32 on a CPU the logits of a round of a few rows are not the model's head's own product.
The head computes ``h @ W^T``, and for 2 to 8 rows MKL's float32 GEMM takes far longer in that order than the same
layer applied as ``W @ h^T``: a forward of 2 rows of Gemma 3 270M (262k-token vocabulary) costs 1.97x one row
through its own head and 1.02x through the product, which alone decides whether drafting can pay there (SmolLM2-135M:
1.64x and 1.29x). Beyond 8 rows the model's own head is the faster (``benchmarks/head_product.py``). Both give the
same logits up to float rounding, as batching rows does. bfloat16 and GPUs keep the model's own head (in bfloat16
on a CPU it is the faster at every count of rows).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import nn
from transformers import DynamicCache

from ..core.layout import RegisterLayout
from ..core.masks import build_attention_mask
from ..methods.base import odd_head
from ..methods.mutor import MuToRModel
from ..models.peft_utils import inner_model
from ..utils.devices import cache_argument
from .loop import Feed, Rows


def register_vectors(model: MuToRModel, count: int) -> torch.Tensor:
    """``(count, C)`` the register inputs for offsets 2..count+1, as they enter the model (the embedding's scale
    applied, :meth:`~mutor.MuToRModel.register_inputs`), in the token embeddings' dtype.

    Raises:
        ValueError: Per-offset registers were not trained for an offset asked for.
    """
    cfg = model.mutor_config
    dtype = model.base_model.get_input_embeddings().weight.dtype
    offsets = list(range(2, count + 2))
    if cfg.register_embedding == "shared":
        index = [0] * count
    else:
        choices = [c[0] for c in cfg.offset_choices()]
        missing = [d for d in offsets if d not in choices]
        if missing:
            raise ValueError(f"draft offsets {missing} have no trained per-offset register (trained offsets: "
                             f"{choices}); use draft_registers <= {max(choices)}")
        index = [choices.index(d) for d in offsets]
    with torch.no_grad():
        return model.register_inputs(torch.tensor(index, dtype=torch.long, device=model.device), dtype)


def step_mask(model: MuToRModel, past: int, m: int, src: torch.Tensor, reg_pos: torch.Tensor, dtype,
              prompt_len: int):
    """Mask rows of the new queries ([m regular tokens; R registers]) over keys [past + m regular; R registers],
    and their position ids. ``prompt_len`` > 0: the prompt attends to itself both ways (bidirectional prefix),
    generated tokens causally."""
    dev = src.device
    n, R = past + m, src.numel()
    L = n + R
    ar = torch.arange(n, device=dev)
    limit = torch.where(ar < prompt_len, prompt_len - 1, ar)                         # (n,)
    pos = torch.cat([ar, reg_pos])[None]                                             # (1, L)
    zeros = lambda k: torch.zeros(1, k, dtype=torch.long, device=dev)               # noqa: E731
    lay = RegisterLayout(
        position_ids=pos, doc_ids=zeros(L),
        limit=torch.cat([limit, limit[past + src]])[None],                           # a register sees what x_src sees
        key_ok=torch.cat([torch.ones(n, dtype=torch.bool, device=dev),
                          torch.zeros(R, dtype=torch.bool, device=dev)])[None],
        ntp_labels=torch.empty(1, n, dtype=torch.long, device=dev), reg_source=src[None], reg_labels=src[None],
        reg_choice=zeros(R), reg_valid=torch.ones(1, R, dtype=torch.bool, device=dev), offset_index=zeros(1)[0])
    full = build_attention_mask(lay, model.attn_implementation, model.windows, dtype)
    rows = lambda t: t[:, :, past:]                                                   # noqa: E731  (1, 1, m+R, L)
    return (rows(full) if torch.is_tensor(full) else {k: rows(v) for k, v in full.items()}), pos[:, past:]


PRODUCT_ROWS = 8      # float32 on a CPU: W @ h^T is the faster for up to 8 rows, h @ W^T beyond (the module)
HEADS = ("auto", "own", "product")


class HeadProduct(NamedTuple):
    """What a round's logits are computed from as ``W @ h^T``: the decoder, its output layer, the model's final
    soft-capping (None: none) and the most rows the product is used for (more go through the model's head)."""

    decoder: nn.Module
    layer: nn.Linear
    softcap: Optional[float]
    rows: float


def head_product(model: MuToRModel, head: str = "auto") -> Optional[HeadProduct]:
    """Where a round's logits are computed here as ``W @ h^T``, and for how many rows; None: through the model's
    own head. ``head``: "auto" (float32 on a CPU, up to :data:`PRODUCT_ROWS` rows), "own" (never) or "product" (for
    any rows, dtype and device: to time it). Only a plain output layer (:func:`~mutor.methods.base.odd_head`);
    any other keeps the model's own head."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, not {head!r}")
    inner = inner_model(model.base_model)
    layer = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if head == "own" or layer is None or odd_head(inner):
        return None
    if head == "auto" and (layer.weight.dtype != torch.float32 or layer.weight.device.type != "cpu"):
        return None
    return HeadProduct(inner.get_decoder(), layer, getattr(inner.config, "final_logit_softcapping", None),
                       PRODUCT_ROWS if head == "auto" else float("inf"))


def round_logits(model: MuToRModel, run: dict, keep: torch.Tensor,
                 product: Optional[HeadProduct] = None) -> torch.Tensor:
    """(N, V) logits of the rows ``keep`` (1, L) of the forward ``run``: as ``W @ h^T`` where ``product`` is given
    and N within its rows, else through the model's own head (:meth:`~mutor.MuToRModel.logits_at`)."""
    if product is None or int(keep.sum()) > product.rows:
        return model.logits_at(run, keep)
    h = product.decoder(**run).last_hidden_state[keep]                               # (N, C)
    logits = torch.mm(product.layer.weight, h.t()).t().contiguous()                  # (N, V)
    if product.layer.bias is not None:
        logits += product.layer.bias
    cap = product.softcap
    return torch.tanh(logits / cap) * cap if cap else logits


class ModelForward:
    """A :class:`~mutor.generation.loop.Target` on a model: its forward, with the registers, and its cache.

    Args:
        model: The model with its registers (a :class:`~mutor.MuToRModel`), sdpa or eager attention.
        registers: The most registers a token is followed by (offsets 2..registers+1).
        prompt_len: The bidirectional prefix's length (0: causal; else the prompt's length).
        head: Which product gives the logits: "auto", "own" or "product" (:func:`head_product`).
    """

    def __init__(self, model: MuToRModel, registers: int, prompt_len: int = 0, head: str = "auto"):
        self.model, self.prompt_len = model, prompt_len
        self.emb = model.base_model.get_input_embeddings()
        self.vectors = register_vectors(model, registers) if registers else None          # (K-1, C)
        self.cache = DynamicCache()
        self.cache_name = cache_argument(model.base_model)
        self.product = head_product(model, head)

    def forward(self, feed: Feed) -> Rows:
        """One forward of ``feed``; the cache grows by all its rows (see :meth:`keep`).

        Returns:
            The rows after the newest kept token and after each draft token, and the register rows.
        """
        model, dev = self.model, self.model.device
        past = self.cache.get_seq_length()
        tokens = torch.tensor(feed.pending + feed.draft, dtype=torch.long, device=dev)   # (m,)
        m, a, r = tokens.numel(), len(feed.pending) - 1, feed.registers
        x = self.emb(tokens[None])                                                        # (1, m, C)
        src = torch.tensor([a + e for e in feed.ends], dtype=torch.long, device=dev).repeat_interleave(r)  # (R,)
        reg_pos = src
        if src.numel():
            reg_pos = past + src + torch.arange(1, r + 1, device=dev).repeat(len(feed.ends))   # (R,) t + d - 1
            x = torch.cat([x, self.vectors[:r].to(x.dtype).repeat(len(feed.ends), 1)[None]], 1)   # (1, m+R, C)
        if m == 1 and not src.numel() and past and not any(model.windows.values()):
            # one regular token, no register, full attention: it sees every cached token, which is what the model
            # does with no mask at all (plain decoding's step; no (past x past) mask to build)
            mask, pos = None, torch.tensor([[past]], device=dev)
        else:
            mask, pos = step_mask(model, past, m, src, reg_pos, x.dtype, self.prompt_len)
        keep = torch.zeros(1, x.shape[1], dtype=torch.bool, device=dev)
        keep[0, a:] = True                                          # rows before a (the prompt's) need no logits
        logits = round_logits(model, {"inputs_embeds": x, "attention_mask": mask, "position_ids": pos,
                                      self.cache_name: self.cache, "use_cache": True}, keep, self.product)  # (m-a+R, V)
        return Rows(logits[:m - a], logits[m - a:].view(len(feed.ends), r, logits.shape[-1]))

    def keep(self, length: int) -> None:
        """The cache keeps its first ``length`` entries: the kept regular tokens (no register, no rejected
        draft)."""
        extra = self.cache.get_seq_length() - length
        if extra:
            self.cache.crop(-extra)


def teacher_forced_drafts(model: MuToRModel, prompt: list[int], answer: list[int], registers: int,
                          prompt_len: int = 0) -> tuple[list[int], list[list[int]]]:
    """What drafting computes round by round, for a known answer in one forward: ``prompt + answer[:-1]`` with
    registers for offsets 2..registers+1 after the prompt's last token and after every answer token but the last.

    Args:
        model: The model with its registers.
        prompt: The prompt's tokens.
        answer: The answer's tokens.
        registers: Registers after each token.
        prompt_len: The bidirectional prefix's length (0: causal).

    Returns:
        ``(ntp, drafts)``: ``ntp[j]`` the regular greedy prediction of ``answer[j]``, ``drafts[j]`` the registers'
        greedy draft after the prompt (j = 0) or after ``answer[j-1]``, proposing ``answer[j+1], ...``.
    """
    target = ModelForward(model, registers, prompt_len)
    with torch.no_grad():
        rows = target.forward(Feed(list(prompt), list(answer[:-1]), registers, list(range(len(answer)))))
    return rows.regular.argmax(-1).tolist(), rows.registers.argmax(-1).tolist()
