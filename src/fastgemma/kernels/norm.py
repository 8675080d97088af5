"""RMSNorm through fastgemma's CPU kernel (`cpu_norm.c`), for decode-sized inputs.

`native_rms_norm(x, scale, eps)` returns None when the kernel cannot be used (other
device or dtype, no native library); the caller then runs its torch maths.
"""

from __future__ import annotations

import torch

from fastgemma.kernels import native


def native_rms_norm(x: torch.Tensor, scale: torch.Tensor | None, eps: float) -> torch.Tensor | None:
    lib = native.load()
    if lib is None or x.device.type != "cpu" or x.dtype not in (torch.bfloat16, torch.float32):
        return None
    x = x.contiguous()
    D = x.shape[-1]
    y = torch.empty_like(x)
    fn = lib.rms_norm_bf16 if x.dtype == torch.bfloat16 else lib.rms_norm_f32
    fn(x.data_ptr(), None if scale is None else scale.data_ptr(), y.data_ptr(), x.numel() // D, D, eps)
    return y
