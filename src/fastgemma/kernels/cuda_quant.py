"""Weight-only int8 / int4 matmul for decode-sized inputs on CUDA (a Triton kernel).

`quant_matmul(x, qweight, scales, scheme)`: x [M, K] (bf16 or fp32, M <= 16) times the matrix
the codes stand for (kernels/quant.py: int8 per output row, int4 per group of 32 or 128,
packed two per byte) -> [M, N] in x's dtype. It reads the codes once and never writes the
dequantised matrix: a quarter (int4) or half (int8) of bf16's bytes, which is the speed-up
of bandwidth-bound decode.

Numbers, and why a row's do not depend on the other rows:
- every call runs one compiled kernel per (N, K, scheme, dtype): BLOCK_M is 16 whatever M
  is (rows past M are masked to zero), so a decode step and a verification run the same
  binary (engine/static_step.py pads both to 16 rows anyway);
- program (n, s) sums the K-slice s of its BLOCK_N outputs in K order, 32 inputs at a time:
  the codes (exact in bf16) times x on tensor cores (fp32 sums; fp32 inputs use the IEEE
  product, not TF32), times the block's scale; each output element is its own dot product,
  whatever row it sits in;
- the SPLIT_K partial sums (a function of N and K only) are added by one fixed-order
  reduction, never by atomics.

The Triton interpreter (TRITON_INTERPRET=1) runs the same kernel on CPU tensors, which is how
the tests check it without a GPU; its bf16 tl.dot is wrong, so there the tiles are widened to
fp32 first (`_IEEE`).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from fastgemma.kernels.quant import QuantScheme

BLOCK_M = 16  # rows of every launch: decode steps and verifications share the kernel
BLOCK_N = 64
TARGET_PROGRAMS = 512  # enough programs to keep every SM of a large GPU streaming
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _quant_matmul_kernel(
    x_ptr, q_ptr, s_ptr, part_ptr,  # x [M, K]; codes; scales fp32; partial sums [SPLIT_K, BLOCK_M, N] fp32
    M, N, K, NUM_GROUPS,
    BLOCKS: tl.constexpr,  # 32-input blocks per K-slice (a constant trip count: one binary per shape)
    BITS: tl.constexpr, GROUP: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    r16 = tl.arange(0, 16)
    row_ok, col_ok = rm[:, None] < M, rn[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(BLOCKS):  # one 32-input block per iteration, in K order
        k0 = (pid_s * BLOCKS + i) * 32
        lo_k, hi_k = k0 + r16, k0 + 16 + r16
        x_lo = tl.load(x_ptr + rm[:, None] * K + lo_k[None, :], mask=row_ok, other=0.0)  # [BM, 16]
        x_hi = tl.load(x_ptr + rm[:, None] * K + hi_k[None, :], mask=row_ok, other=0.0)
        if BITS == 8:
            # codes int8 [N, K]: w_lo [16, BN] = codes of inputs k0..k0+15 for our columns
            w_lo = tl.load(q_ptr + rn[None, :] * K + lo_k[:, None], mask=col_ok, other=0).to(tl.float32)
            w_hi = tl.load(q_ptr + rn[None, :] * K + hi_k[:, None], mask=col_ok, other=0).to(tl.float32)
        else:
            # codes uint8 [N, K / 2]: byte j of a 32-block holds input j (low) and j + 16 (high)
            b = tl.load(q_ptr + rn[None, :] * (K // 2) + (k0 // 2 + r16)[:, None], mask=col_ok, other=0x88)
            w_lo = (b & 0x0F).to(tl.float32) - 8.0
            w_hi = (b >> 4).to(tl.float32) - 8.0
        if IEEE:
            part = tl.dot(x_lo.to(tl.float32), w_lo, input_precision="ieee")
            part = tl.dot(x_hi.to(tl.float32), w_hi, part, input_precision="ieee")
        else:
            part = tl.dot(x_lo, w_lo.to(x_lo.dtype))
            part = tl.dot(x_hi, w_hi.to(x_hi.dtype), part)
        if BITS == 8:
            acc += part
        else:
            scale = tl.load(s_ptr + rn * NUM_GROUPS + k0 // GROUP, mask=rn < N, other=0.0)  # [BN]
            acc += part * scale[None, :]
    if BITS == 8:
        acc = acc * tl.load(s_ptr + rn, mask=rn < N, other=0.0)[None, :]
    out = part_ptr + pid_s * BLOCK_M * N + rm[:, None] * N + rn[None, :]
    tl.store(out, acc, mask=col_ok)


@functools.cache
def split_k(N: int, K: int) -> int:
    """K-slices per output block: a function of the shape alone (never of M), each slice a
    whole number of 32-input blocks (int4 scales are looked up by absolute k, so a slice
    need not hold whole groups)."""
    blocks = K // 32
    want = max(1, TARGET_PROGRAMS // triton.cdiv(N, BLOCK_N))
    best = 1
    for s in range(1, min(want, blocks) + 1):
        if blocks % s == 0:
            best = s
    return best


def quant_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    M, K = x.shape
    N = qweight.shape[0]
    assert M <= BLOCK_M and K % 32 == 0, (x.shape, qweight.shape)
    assert x.dtype in (torch.bfloat16, torch.float32)
    x = x.contiguous()
    splits = split_k(N, K)
    part = torch.empty((splits, BLOCK_M, N), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, BLOCK_N), splits)
    _quant_matmul_kernel[grid](
        x, qweight, scales, part, M, N, K, scales.shape[1] if scales.dim() == 2 else 1,
        BLOCKS=K // 32 // splits, BITS=scheme.bits, GROUP=scheme.group or K, IEEE=x.dtype == torch.float32 or INTERPRETING,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )
    return part.sum(dim=0)[:M].to(x.dtype)
