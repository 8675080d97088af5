"""models/attention.py: a prompt chunk's attention on CPU (`_attend_blocks`) against float64
maths, for causal chunks at any offset, sliding windows, GQA and chunks of several blocks."""

from __future__ import annotations

import pytest
import torch

from fastgemma.models.attention import ATTEND_BLOCK_ROWS, attend


def _reference(q, k, v, mask, scaling):
    H, T, hd = q.shape
    G = H // k.shape[0]
    kf, vf = k.double().repeat_interleave(G, 0), v.double().repeat_interleave(G, 0)
    scores = q.double() @ kf.transpose(1, 2) * scaling  # [H, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ vf


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("H,Hkv,hd", [(4, 1, 256), (8, 2, 64)])
@pytest.mark.parametrize("T,start,window", [
    (37, 0, None),                       # a first chunk, one block
    (ATTEND_BLOCK_ROWS * 2 + 9, 0, None),  # three blocks
    (150, 200, None),                    # a later chunk: keys of earlier chunks too
    (300, 100, 64),                      # sliding: a block skips the keys before its window
    (20, 0, "all"),                      # no mask: every key visible
])
def test_prompt_chunk_attention(dtype, tol, H, Hkv, hd, T, start, window):
    g = torch.Generator().manual_seed(T + start + hd)
    S = start + T
    q = torch.randn(H, T, hd, generator=g).to(dtype)
    k, v = (torch.randn(Hkv, S, hd, generator=g).to(dtype) for _ in range(2))
    pos, keys = torch.arange(start, S)[:, None], torch.arange(S)[None, :]
    mask = None if window == "all" else (keys <= pos) & ((keys > pos - window) if window else True)
    got = attend(q, k, v, mask, hd**-0.5, None)
    assert got.dtype == dtype and got.shape == (H, T, hd)
    assert (got.double() - _reference(q, k, v, mask, hd**-0.5)).abs().max() < tol
