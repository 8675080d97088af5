"""Weight-only quantisation schemes: how a weight matrix is stored in fewer bits.

A scheme turns W [N, K] (any float dtype) into integer codes and fp32 scales; `dequantize`
gives back the matrix the codes stand for. That dequantised matrix *is* the quantised
model: prefill multiplies by it (torch), decode's GEMV (`cpu_quant_gemv.c`) computes the
same sums from the codes directly.

- `int8`: symmetric, one scale per output row: s = max|w| / 127, q = round(w / s) in
  [-127, 127]; `qweight` int8 [N, K], `scales` fp32 [N].
- `int4-g32`, `int4-g128`: symmetric 4-bit, one scale per group of G inputs (Q4_0-like,
  with the scale picked per group among a few candidates for the least squared error):
  w ~ d * (u - 8), u in [0, 15]; `qweight` uint8 [N, K / 2] (per 32-weight block, byte j =
  u[j] | u[j + 16] << 4), `scales` fp32 [N, K / G]. Needs K % G == 0; a matrix whose K is
  not a multiple of G is stored as int8 instead (`scheme_for`).
"""

from __future__ import annotations

import torch

from fastgemma.kernels.schemes import INT8, SCHEMES, QuantScheme, scheme_for  # noqa: F401  (re-exported)


def quantize(w: torch.Tensor, scheme: QuantScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (qweight, scales) as described in the module docstring."""
    w = w.detach().float()
    if scheme.bits == 8:
        scale = w.abs().amax(dim=1) / 127.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        return q.contiguous(), scale.contiguous()
    return _quantize_int4(w, scheme.group)


# Candidate divisors for the int4 scale d = (signed extreme) / c: c = -8 maps the extreme
# exactly onto the code range's end; smaller |c| clip it and refine the rest.
_INT4_DIVISORS = (-8.0, -7.75, -7.5, -7.25, -7.0, -6.75, -6.5)


def _quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    N, K = w.shape
    if K % group:
        raise ValueError(f"int4 with group {group} needs in_features divisible by {group} (got {K})")
    g = w.view(N, K // group, group)
    idx = g.abs().argmax(dim=-1, keepdim=True)
    extreme = g.gather(-1, idx)  # [N, G, 1] signed value of largest magnitude
    best_q, best_d, best_err = None, None, None
    for c in _INT4_DIVISORS:
        d = extreme / c
        d = torch.where(d != 0, d, torch.ones_like(d))
        q = torch.round(g / d).clamp_(-8, 7)
        err = ((q * d - g) ** 2).sum(-1, keepdim=True)
        if best_err is None:
            best_q, best_d, best_err = q, d, err
        else:
            better = err < best_err
            best_q = torch.where(better, q, best_q)
            best_d = torch.where(better, d, best_d)
            best_err = torch.minimum(err, best_err)
    u = (best_q + 8).to(torch.uint8).view(N, K // 32, 2, 16)  # per 32-block: [first 16, last 16]
    packed = (u[:, :, 0, :] | (u[:, :, 1, :] << 4)).reshape(N, K // 2)
    return packed.contiguous(), best_d.view(N, K // group).contiguous()


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, scheme: QuantScheme, dtype: torch.dtype) -> torch.Tensor:
    """The matrix the codes stand for, [N, K] in `dtype` (computed in fp32, then rounded)."""
    if scheme.bits == 8:
        return (qweight.float() * scales[:, None]).to(dtype)
    N, K = qweight.shape[0], qweight.shape[1] * 2
    b = qweight.view(N, K // 32, 16)
    u = torch.stack([b & 0x0F, b >> 4], dim=2).view(N, K)  # [N, K] in [0, 15]
    q = u.float() - 8.0
    return (q.view(N, K // scheme.group, scheme.group) * scales[:, :, None]).view(N, K).to(dtype)


def matvec(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, scheme: QuantScheme, lib) -> torch.Tensor:
    """x: [M, K] (bf16 or fp32) -> [M, N] in x's dtype, with the native kernels of `lib`."""
    xf = x.float().contiguous()
    N = qweight.shape[0]
    M, K = xf.shape
    y = torch.empty((M, N), dtype=x.dtype)
    out_f32 = int(x.dtype == torch.float32)
    if scheme.bits == 8:
        lib.gemv_q8(qweight.data_ptr(), scales.data_ptr(), xf.data_ptr(), y.data_ptr(), M, N, K, out_f32)
    else:
        lib.gemv_q4(qweight.data_ptr(), scales.data_ptr(), xf.data_ptr(), y.data_ptr(), M, N, K, scheme.group, out_f32)
    return y
