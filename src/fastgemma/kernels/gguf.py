"""A GGUF's own quantised blocks as weights (`--quantization gguf`): the matrix a GGUF file
stores, multiplied without a second rounding (`cpu_gguf_gemv.c`).

A matrix is `blocks` (uint8, its rows' bytes as the file stores them, parts one after another)
and `layout` (int64 [P, 2]: per part its ggml type and row count). Parts are the checkpoint
matrices a fused one is made of (q / k / v, gate / up), each in its own type: a Q4_K_M file
mixes Q5_0 and Q8_0 within one q/k/v. Types with a kernel: `KERNEL_TYPES`. Every weight is
decoded to exactly the fp32 value llama.cpp's and gguf-py's dequantisation give (the C file
says why), so `dequantize` is the matrix, bit for bit, and decode's GEMV sums its products
in fp32; prefill multiplies by the dequantised matrix in the model's dtype.
"""

from __future__ import annotations

import torch

# ggml type id -> (name, weights per block, bytes per block), as ggml-common.h lays them out
KERNEL_TYPES = {
    2: ("Q4_0", 32, 18),
    6: ("Q5_0", 32, 22),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    14: ("Q6_K", 256, 210),
}


def row_bytes(ggml_type: int, K: int) -> int:
    _, weights, nbytes = KERNEL_TYPES[ggml_type]
    return K // weights * nbytes


def fits(ggml_type: int, K: int) -> bool:
    """Whether rows of K weights of this type run on the kernels here."""
    return ggml_type in KERNEL_TYPES and K % KERNEL_TYPES[ggml_type][1] == 0


def parts(blocks: torch.Tensor, layout: torch.Tensor, K: int) -> list[tuple[int, int, torch.Tensor]]:
    """(type, rows, that part's bytes [rows, row_bytes]) per part."""
    out, offset = [], 0
    for ggml_type, rows in layout.tolist():
        n = rows * row_bytes(ggml_type, K)
        out.append((ggml_type, rows, blocks[offset : offset + n].view(rows, -1)))
        offset += n
    assert offset == blocks.numel(), (offset, blocks.numel())
    return out


def matvec(x: torch.Tensor, blocks: torch.Tensor, layout: torch.Tensor, lib) -> torch.Tensor:
    """x: [M, K] (bf16 or fp32) -> [M, N] in x's dtype, each part writing its columns."""
    xf = x.float().contiguous()
    M, K = xf.shape
    N = int(layout[:, 1].sum())
    y = torch.empty((M, N), dtype=x.dtype)
    col = 0
    for ggml_type, rows, part in parts(blocks, layout, K):
        lib.gguf_gemv(ggml_type, part.data_ptr(), xf.data_ptr(), y.data_ptr() + col * y.element_size(),
                      M, rows, K, N, int(x.dtype == torch.float32))
        col += rows
    return y


def dequantize(blocks: torch.Tensor, layout: torch.Tensor, K: int, dtype: torch.dtype, lib=None) -> torch.Tensor:
    """The dense matrix [N, K] in `dtype` (the exact fp32 values, then rounded to nearest
    even): with the native kernels when `lib` is given, else with gguf-py."""
    pieces = []
    for ggml_type, rows, part in parts(blocks, layout, K):
        if lib is not None and dtype in (torch.bfloat16, torch.float32):
            out = torch.empty((rows, K), dtype=dtype)
            lib.gguf_dequantize(ggml_type, part.data_ptr(), out.data_ptr(), rows, K, int(dtype == torch.float32))
        else:
            import gguf

            out = torch.from_numpy(gguf.quants.dequantize(part.numpy(), gguf.GGMLQuantizationType(ggml_type))).to(dtype)
        pieces.append(out)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
