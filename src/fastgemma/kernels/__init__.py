"""fastgemma's kernels: C for the CPU (native.py builds them), Triton for CUDA (cuda_*.py)."""

from __future__ import annotations

import functools
import importlib.util

import torch


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
