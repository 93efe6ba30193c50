"""2D rotary positions for image tokens, swapped into any transformers model that uses RoPE.

The decoder's ``rotary_emb`` module maps position ids to ``(cos, sin)``; this one reads the
same flat position ids and turns them into grid cells: position ``p >= grid_start`` is image
token ``i = p - grid_start`` at row ``i // W`` and column ``i % W``; class tokens (``p <
grid_start``) sit at cell (-1, -1), up and left of the grid. Half of each head's rotary
frequencies turn with the row, the other half with the column (LlamaGen's 2D RoPE, with the
rotate-half layout of transformers' ``apply_rotary_pos_emb``), so attention sees relative
(row, column) offsets.

Nothing in MuToR changes for it: a register's position id is ``t + d - 1``, the flat index of
the token just before its target in raster order, i.e. the cell whose next-token prediction
is that target, so under this map a register takes its target-predictor's 2D position.

Checkpoints stay vanilla (``config.json`` says plain RoPE): the grid is saved in the run's
``task_info.json`` and :func:`apply_saved_rotary_2d` puts it back after ``from_pretrained``.
"""

from __future__ import annotations

import os
from typing import Optional, Union

import torch
from torch import nn

__all__ = ["GridRotaryEmbedding", "use_rotary_2d", "apply_saved_rotary_2d"]


class GridRotaryEmbedding(nn.Module):
    """A rotary embedding over 2D grid cells: ``forward(x, position_ids) -> (cos, sin)``, each (B, L, head_dim).

    Half of each head's frequencies turn with the row of a position's cell, the other half with its column.

    Args:
        head_dim: The attention head dimension (divisible by 4).
        width: Grid width W: position ``p >= grid_start`` is cell ``((p - grid_start) // W, (p - grid_start) % W)``.
        grid_start: Position of the first grid token; earlier positions (class tokens) sit at cell (-1, -1).
        theta: The RoPE base.

    Raises:
        ValueError: ``head_dim`` not divisible by 4, ``width`` < 1 or ``grid_start`` < 0.
    """

    def __init__(self, head_dim: int, width: int, grid_start: int = 1, theta: float = 10000.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"2D rotary positions need a head dimension divisible by 4 (got {head_dim})")
        if width < 1 or grid_start < 0:
            raise ValueError(f"grid width must be >= 1 and grid_start >= 0 (got {width}, {grid_start})")
        self.width, self.grid_start = int(width), int(grid_start)
        quarter = head_dim // 4
        inv = 1.0 / (theta ** (torch.arange(quarter, dtype=torch.float) / quarter))   # (head_dim/4,)
        self.inv_freq = nn.Buffer(inv, persistent=False)

    def cells(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of every position id; class tokens at (-1, -1)."""
        i = position_ids - self.grid_start                                            # (B, L)
        image = i >= 0
        row = torch.where(image, torch.div(i, self.width, rounding_mode="floor"), -1)
        col = torch.where(image, i % self.width, -1)
        return row, col

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        """``(cos, sin)``, each (B, L, head_dim) in ``x``'s dtype, for the cells of ``position_ids`` (B, L)."""
        row, col = self.cells(position_ids)
        inv = self.inv_freq.to(device=x.device)
        freqs = torch.cat([row[..., None].float() * inv, col[..., None].float() * inv], -1)  # (B, L, head_dim/2)
        emb = torch.cat([freqs, freqs], -1)                                          # (B, L, head_dim)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _decoder_with_rotary(model: nn.Module) -> nn.Module:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    dec = inner.get_decoder() if hasattr(inner, "get_decoder") else inner
    if not isinstance(getattr(dec, "rotary_emb", None), nn.Module):
        raise ValueError(f"{type(inner).__name__}: 2D rotary positions need a decoder with a `rotary_emb` module "
                         "(Llama, Mistral, Qwen, Gemma, ...); this model has none")
    return dec


def use_rotary_2d(model: nn.Module, width: int, grid_start: int = 1) -> nn.Module:
    """Replace the model's rotary embedding with :class:`GridRotaryEmbedding`, in place.

    Args:
        model: A transformers causal LM (or a peft model around one) whose decoder has a ``rotary_emb`` module
            with plain RoPE.
        width: Grid width (tokens per raster row).
        grid_start: Position of the first grid token.

    Returns:
        ``model``.

    Raises:
        ValueError: The decoder has no ``rotary_emb``, or its RoPE is scaled (``rope_type`` other than default).
    """
    dec = _decoder_with_rotary(model)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"2D rotary positions replace plain RoPE; this model uses rope_type={rope['rope_type']!r}")
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    old = dec.rotary_emb
    new = GridRotaryEmbedding(head_dim, width, grid_start, theta)
    dev = next((b.device for b in old.buffers()), None)
    dec.rotary_emb = new.to(dev) if dev is not None else new
    return model


def apply_saved_rotary_2d(model: nn.Module, model_dir: Union[str, os.PathLike]) -> Optional[dict]:
    """After ``from_pretrained(model_dir)``: restore 2D rotary positions if the run used them.

    Args:
        model: The model loaded from ``model_dir``.
        model_dir: A run or checkpoint directory; its ``task_info.json`` (or its parent's, for a checkpoint
            inside a run) records the grid.

    Returns:
        The grid applied (``width``, ``grid_start``), or None when the run used plain RoPE.
    """
    from ..utils.io import run_json_files

    info = next(run_json_files(model_dir, "task_info.json"), {})
    spec = info.get("rotary_2d")
    if spec:
        use_rotary_2d(model, **spec)
    return spec
