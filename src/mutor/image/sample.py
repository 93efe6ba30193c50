"""Class-conditional sampling of image tokens with a KV cache and classifier-free guidance.

Conditional and unconditional rows run as one batch of ``2B``: row ``i`` starts from the class
token, row ``B+i`` from the null class. At every step the next-token logits are combined as
``l = u + s * (c - u)`` (``s = 1`` is plain conditional sampling, the paper uses ``s = 2``),
divided by the temperature, restricted to the ``top_k`` best codes, and one code is drawn for
both rows of the pair. Only codebook tokens can be drawn (class tokens are masked out), so every
sample is a valid ``H x W`` grid of codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from .tokens import ImageLayout, dequantize

__all__ = ["sample_codes", "save_grid_png"]


@torch.no_grad()
def sample_codes(model: torch.nn.Module, layout: ImageLayout, classes: Sequence[int], cfg_scale: float = 2.0,
                 temperature: float = 1.0, top_k: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 batch_size: int = 256, always_guide: bool = False) -> np.ndarray:
    """Sample one image per requested class, with a KV cache and classifier-free guidance.

    Args:
        model: A causal LM trained on an image task (the plain model, not a training wrapper).
        layout: The task's vocabulary and grid.
        classes: The class of each image to sample.
        cfg_scale: Guidance scale s in ``u + s * (c - u)``; 1 is plain conditional sampling, and then the
            unconditional rows are skipped (``u + 1*(c-u) = c``) unless ``always_guide``.
        temperature: Divides the guided logits (> 0).
        top_k: Sample among the ``top_k`` most likely codes only (>= 1); None: among all.
        generator: Random numbers for the draws (on the CPU).
        batch_size: Images sampled at once.
        always_guide: Run the unconditional rows even at ``cfg_scale == 1``.

    Returns:
        (len(classes), H*W) int64 codes in raster order.

    Raises:
        ValueError: ``temperature`` <= 0 or ``top_k`` < 1.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None (got {top_k})")
    from transformers import DynamicCache

    from ..utils.devices import cache_argument, model_device

    dev = model_device(model)
    K = layout.codebook_size
    out = []
    for i in range(0, len(classes), batch_size):
        cls = torch.as_tensor(list(classes[i:i + batch_size]), device=dev) + K            # (B,)
        B = len(cls)
        guided = cfg_scale != 1.0 or always_guide
        first = torch.cat([cls, torch.full_like(cls, layout.null_class)]) if guided else cls   # (2B,) or (B,)
        cache = DynamicCache(config=model.config)
        kv = cache_argument(model)                                                     # cache / past_key_values
        logits = model(input_ids=first[:, None], use_cache=True, **{kv: cache})
        codes = []
        for step in range(layout.num_tokens):
            lg = logits.logits[:, -1, :K].float()                                          # (2B, K): codes only
            if guided:
                c, u = lg[:B], lg[B:]
                lg = u + cfg_scale * (c - u)                                                # (B, K)
            lg = lg / temperature
            if top_k is not None and top_k < K:
                kth = lg.topk(top_k, dim=-1).values[:, -1:]
                lg = lg.masked_fill(lg < kth, float("-inf"))
            probs = torch.softmax(lg, -1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(dev)[:, 0]        # (B,)
            codes.append(nxt)
            if step == layout.num_tokens - 1:
                break
            feed = torch.cat([nxt, nxt]) if guided else nxt
            logits = model(input_ids=feed[:, None], use_cache=True, **{kv: cache})       # the cache grows in place
        out.append(torch.stack(codes, 1).cpu())
    return torch.cat(out).numpy().astype(np.int64)


def save_grid_png(codes: np.ndarray, layout: ImageLayout, path: Path, ncols: int = 10,
                  title: Optional[str] = None) -> None:
    """Write a PNG grid of decoded images (digits: intensity levels as grey values), atomically.

    Args:
        codes: (N, H*W) codes, as :func:`sample_codes` returns them.
        layout: Their vocabulary and grid.
        path: The PNG file to write.
        ncols: Images per row of the grid.
        title: A title above the grid.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..utils.io import atomic_write

    levels = layout.levels or layout.codebook_size
    imgs = dequantize(codes, levels).reshape(-1, layout.height, layout.width)
    n = len(imgs)
    nrows = max(1, -(-n // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * 0.8, nrows * 0.8 + (0.4 if title else 0)), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, img in zip(axes.ravel(), imgs):
        ax.imshow(img, cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
    if title:
        fig.suptitle(title, fontsize=9)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
