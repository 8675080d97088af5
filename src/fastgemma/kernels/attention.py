"""Single-query attention for decode: fastgemma's CPU kernel, torch's maths elsewhere.

`attend_decode(q, k, v, S, first, scaling)` with q: [H, 1, hd] and k, v: [Hkv, slots, hd] the
cache buffers of one layer: the query sees the S keys in slots first, first + 1, ... (mod
slots), which are the visible keys in position order (models/kv_cache.py `visible_keys`).
On CPU with the native library it runs `cpu_attention.c` (fp32 scores, softmax and sums;
one pass over K and V); otherwise the same maths in torch.
"""

from __future__ import annotations

import torch

from fastgemma.kernels import native


def _torch_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """q: [H, 1, hd]; k, v: [Hkv, S, hd], every key visible."""
    H, _, hd = q.shape
    Hkv = k.shape[0]
    qg = q.reshape(Hkv, H // Hkv, hd).float()  # [Hkv, G, hd]
    probs = torch.softmax((qg @ k.float().transpose(1, 2)) * scaling, dim=-1)  # [Hkv, G, S]
    return (probs @ v.float()).to(q.dtype).view(H, 1, hd)


def attend_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, S: int, first: int, scaling: float
) -> torch.Tensor:
    H, T, hd = q.shape
    Hkv, slots, _ = k.shape
    assert T == 1 and H % Hkv == 0 and 0 < S <= slots and 0 <= first < slots, (q.shape, k.shape, S, first)
    lib = native.load()
    usable = (
        lib is not None
        and q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float32)
        and hd % 16 == 0
        and k.is_contiguous()
        and v.is_contiguous()
    )
    if not usable:
        idx = torch.remainder(torch.arange(first, first + S, device=k.device), slots)
        return _torch_attend(q, k[:, idx], v[:, idx], scaling)
    q = q.contiguous()
    out = torch.empty_like(q)
    scratch = torch.empty(H * (S + hd), dtype=torch.float32)
    fn = lib.attend_decode_bf16 if q.dtype == torch.bfloat16 else lib.attend_decode_f32
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), H, Hkv, S, first, slots, hd, scaling, scratch.data_ptr())
    return out
