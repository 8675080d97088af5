"""GELU (tanh approximation) as every fastgemma path computes it.

bf16 on the CPU is a lookup in one table of GELU at every bf16 number, so a value's result
depends on the value only (torch's vectorised and scalar tanh differ in the last bit, by where
a value sits in the loop), and the fused native decode step (cpu_decode_layer.c) reads the very
same table. The table is a constant, computed once on first use.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fastgemma.kernels import bf16_table


@functools.cache
def gelu_tanh_table() -> torch.Tensor:
    """GELU (tanh) at every bf16 number [65536] (kernels/bf16_table.py)."""
    return bf16_table.tabulate(lambda x: F.gelu(x, approximate="tanh"))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation; bf16 on CPU through `gelu_tanh_table()`."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        return bf16_table.lookup(gelu_tanh_table(), x)
    return F.gelu(x, approximate="tanh")
