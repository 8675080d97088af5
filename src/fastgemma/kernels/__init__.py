"""fastgemma's kernels: C for the CPU (native.py builds them), Triton for CUDA (cuda_*.py)."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KernelChoice:
    """Which kernels a model is built with; fixed at construction (models/gemma.py).

    `native`: fastgemma's CPU kernels (GEMV, norm, attention) for decode-sized inputs, on
    the plain and the fast path alike (they round differently from torch's, so they are
    part of the model's numbers). `fused_decode`: a bf16 decode step's layers in one native
    call (kernels/decode_layers.py). `lm_head_screen`: greedy tokens through the exact int8
    screen (kernels/lm_head_screen.py). The last two are exact: they give the plain path's
    tokens, and apply only with `native` where the model supports them.
    """

    native: bool = False
    fused_decode: bool = False
    lm_head_screen: bool = False


@functools.cache
def has_triton() -> bool:
    """Whether Triton is installed (it comes with torch's CUDA wheels on Linux); without it
    CUDA runs torch's ops in place of the cuda_*.py kernels."""
    return importlib.util.find_spec("triton") is not None


def use_triton(x: torch.Tensor) -> bool:
    """Whether ops on x run fastgemma's Triton kernels (cuda_*.py): on CUDA, with Triton.
    Looked up as `kernels.use_triton` at each call, so tests can route CPU tensors through
    Triton's interpreter."""
    return x.is_cuda and has_triton()
