"""GELU (tanh approximation) as every fastgemma path computes it.

bf16 on the CPU is a lookup in one table of GELU at every bf16 number, so a value's result
depends on the value only (torch's vectorised and scalar tanh differ in the last bit, by where
a value sits in the loop), and the fused native decode step (cpu_decode_layer.c) reads the very
same table. The table is a constant, computed once on first use. fp32 decode rows (up to
`NATIVE_MAX_ROWS`) with the native kernels go through `cpu_norm.c`'s scalar GELU for the same
reason: a batch of rows must give each row the bits it gets alone.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fastgemma.kernels import bf16_table, native
from fastgemma.kernels.linear import NATIVE_MAX_ROWS


@functools.cache
def gelu_tanh_table() -> torch.Tensor:
    """GELU (tanh) at every bf16 number [65536] (kernels/bf16_table.py)."""
    return bf16_table.tabulate(lambda x: F.gelu(x, approximate="tanh"))


def gelu_tanh(x: torch.Tensor, use_native: bool = False) -> torch.Tensor:
    """GELU with the tanh approximation; bf16 on CPU through `gelu_tanh_table()`; fp32
    decode rows [T <= NATIVE_MAX_ROWS, ...] on CPU through the native kernel with `use_native`."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        return bf16_table.lookup(gelu_tanh_table(), x)
    lib = native.load() if use_native and x.device.type == "cpu" and x.dtype == torch.float32 else None
    if lib is not None and x.shape[0] <= NATIVE_MAX_ROWS:
        x = x.contiguous()
        y = torch.empty_like(x)
        lib.gelu_tanh_f32(x.data_ptr(), y.data_ptr(), x.numel())
        return y
    return F.gelu(x, approximate="tanh")


def gelu_tanh_mul(gate_up: torch.Tensor, intermediate: int, use_native: bool = False) -> torch.Tensor:
    """gate_up: [T, 2 I] = [gate | up] per row -> gelu_tanh(gate) * up [T, I]. bf16 on CPU with
    the native library: one native pass (`cpu_decode_layer.c` gelu_mul_bf16: the same table
    and bf16 product, so the same bits as the two torch ops for any T, NaN payloads apart)."""
    lib = native.load() if gate_up.dtype == torch.bfloat16 and gate_up.device.type == "cpu" else None
    if lib is not None and gate_up.dim() == 2 and gate_up.shape[1] == 2 * intermediate:
        gate_up = gate_up.contiguous()
        y = torch.empty(gate_up.shape[0], intermediate, dtype=torch.bfloat16)
        lib.gelu_mul_bf16(gelu_tanh_table().data_ptr(), gate_up.data_ptr(), y.data_ptr(), gate_up.shape[0], intermediate)
        return y
    gate, up = gate_up.split(intermediate, dim=-1)
    return gelu_tanh(gate, use_native) * up
