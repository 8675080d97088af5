"""Decode attention over the static cache for fixed-shape steps on CUDA (Triton kernels).

`attend_in_place(q, k, v, positions, valid, sliding, ring, window, scaling)`: q [H, T, hd]
(after norm and RoPE), k / v [Hkv, slots + 1, hd] one layer's whole cache buffers (the last
slot is the scratch slot), positions [T] and valid [T] on the device -> [H, T, hd] in q's
dtype. Row t attends over the positions its query sees (full: 0..q; sliding: the last
`window` up to q), read from slot = position (full) or position mod `ring`; an invalid row
(padding of engine/static_step.py) does no work and gives zeros.

Unlike masked attention over the whole buffer, the work follows each row's context, not
the buffer's size, and head dims 256 and 512 need nothing special. Two kernels:
1. program (head, row, j) covers the row's j-th split: absolute positions [s·SPLIT,
   (s+1)·SPLIT) with s = first visible position // SPLIT + j, in blocks of BLOCK positions,
   in order, with an online softmax in fp32; it writes the split's running max m, sum l and
   unnormalised output acc;
2. program (head, row) folds the splits in order: out = sum_j e^(m_j - M) acc_j / sum_j
   e^(m_j - M) l_j.
A row's numbers depend only on its query, its position and the cache: the split and block
boundaries are absolute positions, every loop runs in position order, and no program reads
another row. So a verification's row is bit for bit its decode step (engine/speculative.py),
whatever the other rows hold or how many there are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT = 256  # positions per split: splits run in parallel, then fold in order
BLOCK = 16  # positions per inner step


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, valid_ptr, m_ptr, l_ptr, acc_ptr,
    T, NUM_SPLITS, GROUP, SLOTS, RING, WINDOW, scaling,
    SLIDING: tl.constexpr, HD: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
):
    h, t, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    d = tl.arange(0, HD)
    out = (h * T + t) * NUM_SPLITS + j
    q_pos = tl.load(pos_ptr + t)
    lo = tl.maximum(q_pos - WINDOW + 1, 0) if SLIDING else q_pos * 0  # first visible position
    first = (lo // SPLIT + j) * SPLIT  # program j: the row's j-th split, at absolute boundaries
    last = first + SPLIT - 1
    m = tl.full((), float("-inf"), tl.float32)
    l_sum = tl.zeros((), tl.float32)
    acc = tl.zeros((HD,), tl.float32)
    if (tl.load(valid_ptr + t) != 0) & (first <= q_pos) & (last >= lo):
        q = tl.load(q_ptr + (h * T + t) * HD + d).to(tl.float32)
        base = (h // GROUP) * SLOTS
        for b in range(0, SPLIT, BLOCK):
            x = first + b + tl.arange(0, BLOCK)  # positions of this block
            ok = (x >= lo) & (x <= q_pos)
            if (first + b <= q_pos) & (first + b + BLOCK - 1 >= lo):
                slot = x % RING if SLIDING else x
                offs = (base + slot)[:, None] * HD + d[None, :]
                k = tl.load(k_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)  # [BLOCK, HD]
                s = tl.where(ok, tl.sum(k * q[None, :], axis=1) * scaling, float("-inf"))  # [BLOCK]
                m_new = tl.maximum(m, tl.max(s, axis=0))
                alpha = tl.exp(m - m_new)
                p = tl.where(ok, tl.exp(s - m_new), 0.0)
                v = tl.load(v_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
                l_sum = l_sum * alpha + tl.sum(p, axis=0)
                acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
                m = m_new
    tl.store(m_ptr + out, m)
    tl.store(l_ptr + out, l_sum)
    tl.store(acc_ptr + out * HD + d, acc)


@triton.jit
def _fold_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, T, NUM_SPLITS: tl.constexpr, HD: tl.constexpr):
    h, t = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, HD)
    row = (h * T + t) * NUM_SPLITS
    m_all = tl.full((), float("-inf"), tl.float32)
    l_all = tl.zeros((), tl.float32)
    acc = tl.zeros((HD,), tl.float32)
    for j in range(0, NUM_SPLITS):
        l_j = tl.load(l_ptr + row + j)
        if l_j > 0:
            m_j = tl.load(m_ptr + row + j)
            m_new = tl.maximum(m_all, m_j)
            a, b = tl.exp(m_all - m_new), tl.exp(m_j - m_new)
            l_all = l_all * a + l_j * b
            acc = acc * a + tl.load(acc_ptr + (row + j) * HD + d) * b
            m_all = m_new
    res = tl.where(l_all > 0, acc / tl.maximum(l_all, 1e-30), 0.0)
    tl.store(o_ptr + (h * T + t) * HD + d, res.to(o_ptr.dtype.element_ty))


def attend_in_place(
    q: torch.Tensor,  # [H, T, hd]
    k: torch.Tensor,  # [Hkv, slots + 1, hd]
    v: torch.Tensor,
    positions: torch.Tensor,  # [T] int64
    valid: torch.Tensor,  # [T] bool
    sliding: bool,
    ring: int,
    window: int,
    scaling: float,
) -> torch.Tensor:
    H, T, hd = q.shape
    Hkv, slots, _ = k.shape
    assert H % Hkv == 0 and hd & (hd - 1) == 0, (q.shape, k.shape)  # head dims are powers of two
    assert k.is_contiguous() and v.is_contiguous()
    q = q.contiguous()
    # splits a row can touch: full layers, all of 0..slots - 2 (the last slot is scratch);
    # sliding, its window, which may straddle one more split boundary
    num_splits = triton.cdiv(slots - 1, SPLIT) if not sliding else triton.cdiv(window, SPLIT) + 1
    m = torch.empty((H, T, num_splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty((H, T, num_splits, hd), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_kernel[(H, T, num_splits)](
        q, k, v, positions, valid, m, l_sum, acc,
        T, num_splits, H // Hkv, slots, ring, window, scaling,
        SLIDING=sliding, HD=hd, SPLIT=SPLIT, BLOCK=BLOCK,
    )
    _fold_kernel[(H, T)](m, l_sum, acc, out, T, NUM_SPLITS=num_splits, HD=hd)
    return out
