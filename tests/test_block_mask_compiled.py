"""The compiled, dynamic-shape BlockMask builder (the CUDA default) against the eager one.

On CPU the first compile takes minutes, hence ``slow``; the later cases, with new layouts,
batch sizes and lengths, reuse the one graph. Equality is checked on the block structure
(which blocks are skipped, partial or full), the part the compiled builder computes.
"""

import pytest
import torch

from mutor.core.layout import build_layout
from mutor.core.masks import block_mask
from mutor.methods.mutor import MuToRConfig

pytestmark = pytest.mark.slow


def _layout(B, T, seed, d_max=4):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 100, (B, T), generator=g)  # (B, T)
    labels[:, : T // 4] = -100  # a prompt, so registers start after it
    labels[0, -T // 8:] = -100  # and one row padded at the end
    return build_layout(labels, MuToRConfig(d_max=d_max), generator=g)


def _structure(bm):
    return bm.to_dense(), bm.kv_num_blocks, bm.full_kv_num_blocks


@pytest.mark.parametrize("window", [None, 64])
def test_compiled_block_mask_equals_eager(window):
    torch._dynamo.reset()
    for seed, (B, T) in enumerate([(2, 300), (2, 300), (3, 300), (2, 520), (1, 700)]):
        lay = _layout(B, T, seed)
        got = _structure(block_mask(lay, window, compile=True))
        want = _structure(block_mask(lay, window, compile=False))
        for g, w in zip(got, want):
            assert torch.equal(g, w), (seed, B, T, window)
