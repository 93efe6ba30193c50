"""The image-token vocabulary shared by the data, the sampler and the metrics: ids, grid, intensities.

Ids: image codes ``0..K-1``, then one token per class ``K..K+C-1``, then the null class
``K+C`` (the unconditional "class" of classifier-free guidance). A sequence is
``[class token] + H*W codes`` in raster order. For digits the codes are intensity levels:
``quantize`` maps pixel values to codes, ``dequantize`` maps codes back to bin centres in
[0, 1] (what the metrics' classifier reads and what sample grids draw).

This module imports nothing else of ``mutor.image``, so ``data``, ``sample`` and ``metrics``
depend on it and on each other without a cycle (data -> metrics -> sample -> tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

__all__ = ["ImageLayout", "dequantize", "quantize"]


@dataclass(frozen=True)
class ImageLayout:
    """Token ids and grid of one image-token vocabulary (saved with a run as ``image_layout.json``)."""

    codebook_size: int
    num_classes: int
    height: int
    width: int
    levels: Optional[int] = None          # digits: intensity levels (codes are levels)

    @property
    def null_class(self) -> int:
        return self.codebook_size + self.num_classes

    @property
    def vocab_size(self) -> int:
        return self.codebook_size + self.num_classes + 1

    @property
    def num_tokens(self) -> int:
        return self.height * self.width

    def class_token(self, c: int) -> int:
        return self.codebook_size + int(c)

    def to_dict(self) -> dict:
        return asdict(self)


def quantize(pixels: np.ndarray, levels: int, max_value: float = 16.0) -> np.ndarray:
    """Pixel intensities in [0, max_value] to integer codes 0..levels-1 (equal-width bins)."""
    return np.clip(np.floor(pixels / max_value * levels), 0, levels - 1).astype(np.int64)


def dequantize(codes: np.ndarray, levels: int) -> np.ndarray:
    """Codes back to intensities in [0, 1] (bin centres)."""
    return (np.asarray(codes, dtype=np.float64) + 0.5) / levels
