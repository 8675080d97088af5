"""Elementwise bf16 functions as tables: one result per bf16 number, whatever its position.

torch's vectorised and scalar loops can round the same input differently (its vectorised
tanh, say), so a bf16 function applied elementwise may depend on where a value sits. A table
of the function at all 65 536 bf16 numbers, looked up by bit pattern, depends on the value
only — and the same table can be handed to a C kernel, which then agrees with the torch path
on every input by construction. Tables are indexed by the signed 16-bit pattern + 32768.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def every_bf16(device: torch.device | str = "cpu") -> torch.Tensor:
    """All bf16 numbers (NaNs and infinities included) [65536], ordered by signed bit pattern."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32, device=device).to(torch.int16).view(torch.bfloat16)


def tabulate(fn: Callable[[torch.Tensor], torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """fn at every bf16 number [65536] bf16, contiguous."""
    return fn(every_bf16(device)).to(torch.bfloat16).contiguous()


def lookup(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """table[x] for a bf16 tensor x of any shape."""
    return table[x.view(torch.int16).long() + 2**15]
