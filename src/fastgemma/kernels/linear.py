"""The decoder's linear layer: y = x @ W^T, with our GEMV for single-token CPU inputs.

Batch-1 decode multiplies one row by every weight matrix; torch's stock CPU kernels reach a
third of the memory bandwidth there, `cpu_gemv.c` most of it. Which kernel runs is a
property of the model (`use_native`), the same for the plain and the fast path, so both
round identically. Multi-row inputs (prefill, scoring) and other devices use torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastgemma.kernels import native


def linear(x: torch.Tensor, weight: torch.Tensor, use_native: bool) -> torch.Tensor:
    """x: [M, K], weight: [N, K] -> [M, N]."""
    if not (use_native and x.shape[0] == 1 and x.device.type == "cpu" and x.dtype == weight.dtype):
        return F.linear(x, weight)
    lib = native.load()
    if lib is None or x.dtype not in (torch.bfloat16, torch.float32) or not weight.is_contiguous():
        return F.linear(x, weight)
    x = x.contiguous()
    N, K = weight.shape
    y = torch.empty((1, N), dtype=x.dtype)
    if x.dtype == torch.bfloat16:
        lib.gemv_bf16(weight.data_ptr(), x.data_ptr(), y.data_ptr(), N, K, 0)
    else:
        lib.gemv_f32(weight.data_ptr(), x.data_ptr(), y.data_ptr(), N, K)
    return y


class Linear(nn.Linear):
    """nn.Linear without bias whose forward picks the kernel above."""

    use_native: bool = False

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.use_native)
