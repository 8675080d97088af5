"""Single-query attention for decode: fastgemma's CPU kernel, torch's maths elsewhere.

`attend_decode(q, k, v, S, first, scaling)` with q: [H, 1, hd] and k, v: [Hkv, slots, hd] the
cache buffers of one layer: the query sees the S keys in slots first, first + 1, ... (mod
slots), which are the visible keys in position order (models/kv_cache.py `visible_keys`).
On CPU with the native library it runs `cpu_attention.c` (fp32 scores, softmax and sums;
one pass over K and V); otherwise the same maths in torch.

`attend_decode_rows(q, ks, vs, S, first, scaling)`: the rows of a batched decode step in one
call, row t (q: [H, T, hd]) over its own buffers ks[t], vs[t] (each [Hkv, slots, hd]): each
row's result has the bits `attend_decode` gives it alone.
"""

from __future__ import annotations

import ctypes

import torch

from fastgemma.kernels import native


def _torch_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """q: [H, 1, hd]; k, v: [Hkv, S, hd], every key visible."""
    H, _, hd = q.shape
    Hkv = k.shape[0]
    qg = q.reshape(Hkv, H // Hkv, hd).float()  # [Hkv, G, hd]
    probs = torch.softmax((qg @ k.float().transpose(1, 2)) * scaling, dim=-1)  # [Hkv, G, S]
    return (probs @ v.float()).to(q.dtype).view(H, 1, hd)


def _native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The native library where it runs this call (CPU, bf16 / fp32, hd % 16 == 0), else None."""
    lib = native.load()
    usable = (
        lib is not None
        and q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float32)
        and q.shape[-1] % 16 == 0
        and k.is_contiguous()
        and v.is_contiguous()
    )
    return lib if usable else None


def attend_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, S: int, first: int, scaling: float
) -> torch.Tensor:
    H, T, hd = q.shape
    Hkv, slots, _ = k.shape
    assert T == 1 and H % Hkv == 0 and 0 < S <= slots and 0 <= first < slots, (q.shape, k.shape, S, first)
    lib = _native(q, k, v)
    if lib is None:
        idx = torch.remainder(torch.arange(first, first + S, device=k.device), slots)
        return _torch_attend(q, k[:, idx], v[:, idx], scaling)
    q = q.contiguous()
    out = torch.empty_like(q)
    scratch = torch.empty(H * (S + hd), dtype=torch.float32)
    fn = lib.attend_decode_bf16 if q.dtype == torch.bfloat16 else lib.attend_decode_f32
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), H, Hkv, S, first, slots, hd, scaling, scratch.data_ptr())
    return out


def attend_decode_rows(
    q: torch.Tensor,  # [H, T, hd]
    ks: list[torch.Tensor],  # T x [Hkv, slots, hd]
    vs: list[torch.Tensor],
    S: list[int],
    first: list[int],
    scaling: float,
) -> torch.Tensor:  # [H, T, hd]
    H, T, hd = q.shape
    lib = _native(q, ks[0], vs[0])
    if lib is None or T == 1 or not all(k.is_contiguous() and v.is_contiguous() for k, v in zip(ks, vs)):
        rows = [attend_decode(q[:, t : t + 1], ks[t], vs[t], S[t], first[t], scaling) for t in range(T)]
        return torch.cat(rows, dim=1) if T > 1 else rows[0]
    Hkv, slots, _ = ks[0].shape
    assert all(k.shape == v.shape == ks[0].shape for k, v in zip(ks, vs)), "rows of one layer's caches"
    assert all(0 < s <= slots and 0 <= f < slots for s, f in zip(S, first)), (S, first, slots)
    qt = q.transpose(0, 1).contiguous()  # [T, H, hd]: row t's heads together
    out = torch.empty_like(qt)
    scratch = torch.empty(H * (sum(S) + T * hd), dtype=torch.float32)
    ptrs = (ctypes.c_void_p * T)
    i64s = ctypes.c_int64 * T
    fn = lib.attend_decode_bf16_rows if q.dtype == torch.bfloat16 else lib.attend_decode_f32_rows
    fn(qt.data_ptr(), H * hd, ptrs(*[k.data_ptr() for k in ks]), ptrs(*[v.data_ptr() for v in vs]), out.data_ptr(),
       H * hd, i64s(*S), i64s(*first), T, H, Hkv, slots, hd, scaling, scratch.data_ptr())
    return out.transpose(0, 1)  # [H, T, hd]
