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
    """Token ids and grid of one image-token vocabulary (saved with a run in its ``task_info.json``).

    Ids: image codes ``0..K-1``, one token per class ``K..K+C-1``, then the null class ``K+C``.

    Attributes:
        codebook_size: K, the number of image codes.
        num_classes: C, the number of classes.
        height: Rows of the token grid.
        width: Columns of the token grid (tokens per raster row).
        levels: For digits, the intensity levels the codes stand for; None for VQ codes.
    """

    codebook_size: int
    num_classes: int
    height: int
    width: int
    levels: Optional[int] = None

    @property
    def null_class(self) -> int:
        """The id of the null class (the unconditional "class" of classifier-free guidance)."""
        return self.codebook_size + self.num_classes

    @property
    def vocab_size(self) -> int:
        """Codes, classes and the null class."""
        return self.codebook_size + self.num_classes + 1

    @property
    def num_tokens(self) -> int:
        """Image tokens per sequence (height x width)."""
        return self.height * self.width

    def class_token(self, c: int) -> int:
        """The token id of class ``c``."""
        return self.codebook_size + int(c)

    def to_dict(self) -> dict:
        """Every field by name."""
        return asdict(self)


def quantize(pixels: np.ndarray, levels: int, max_value: float = 16.0) -> np.ndarray:
    """Pixel intensities to integer codes in equal-width bins.

    Args:
        pixels: Intensities in [0, ``max_value``].
        levels: The number of codes.
        max_value: The largest intensity (16 for scikit-learn's digits).

    Returns:
        int64 codes in ``0..levels-1``, the shape of ``pixels``.
    """
    return np.clip(np.floor(pixels / max_value * levels), 0, levels - 1).astype(np.int64)


def dequantize(codes: np.ndarray, levels: int) -> np.ndarray:
    """Codes back to intensities in [0, 1], the centres of their bins.

    Args:
        codes: Integer codes in ``0..levels-1``.
        levels: The number of codes.

    Returns:
        float64 intensities, the shape of ``codes``.
    """
    return (np.asarray(codes, dtype=np.float64) + 0.5) / levels
