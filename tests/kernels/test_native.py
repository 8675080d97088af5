"""fastgemma's C kernels against torch's maths: GEMV (bf16, fp32, ragged K) and decode attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastgemma.kernels import native
from fastgemma.kernels.attention import _torch_attend, attend_decode, attend_decode_rows
from fastgemma.kernels.linear import NATIVE_MAX_ROWS, linear

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")


@pytest.mark.parametrize("N,K", [(1, 16), (7, 640), (1030, 256), (64, 33), (5, 2049)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_matches_fp64_reference(N, K, dtype):
    g = torch.Generator().manual_seed(N * K)
    w, x = torch.randn(N, K, generator=g).to(dtype), torch.randn(1, K, generator=g).to(dtype)
    got = linear(x, w, use_native=True)
    exact = (x.double() @ w.double().t()).to(dtype)  # the correctly rounded result
    tol = 1e-5 * K**0.5 if dtype == torch.float32 else 0  # bf16 output: at most one rounding step off
    assert got.shape == (1, N) and got.dtype == dtype
    if dtype == torch.float32:
        assert (got - exact).abs().max() <= tol * exact.abs().max().clamp(min=1)
    else:
        ulp = torch.finfo(torch.bfloat16).eps * exact.float().abs().clamp(min=1e-3)
        assert ((got.float() - exact.float()).abs() <= ulp * 1.01).all()


def test_gemv_only_for_decode_sized_inputs():
    w, x = torch.randn(8, 16), torch.randn(NATIVE_MAX_ROWS + 1, 16)
    assert torch.equal(linear(x, w, use_native=True), F.linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,K", [(37, 640), (8, 1000), (39, 1000), (262, 2048)])
def test_gemv_rows_are_row_invariant(dtype, N, K):
    """Each row of a multi-row product has exactly the bits of that row alone (what a
    speculative verification and batched decoding rely on): every tile of inputs (1-4, the
    last one ragged) and weight rows (pairs, a ragged last block of 1-3)."""
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g).to(dtype)
    x = torch.randn(NATIVE_MAX_ROWS, K, generator=g).to(dtype)
    for M in (2, 3, 5, 7, NATIVE_MAX_ROWS):
        rows = linear(x[:M], w, use_native=True)
        for m in range(M):
            assert torch.equal(rows[m], linear(x[m : m + 1], w, use_native=True)[0])
        if dtype == torch.bfloat16:  # the fp32 sums too (bf16 outputs round most order changes away)
            sums = _gemv_bf16_sums(x[:M], w)
            for m in range(M):
                assert torch.equal(sums[m], _gemv_bf16_sums(x[m : m + 1], w)[0])


def _gemv_bf16_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """gemv_bf16's fp32 sums (out_f32), before the rounding to bf16."""
    (M, K), N = x.shape, w.shape[0]
    y = torch.empty(M, N)
    native.load().gemv_bf16(w.data_ptr(), x.contiguous().data_ptr(), y.data_ptr(), M, N, K, 1)
    return y


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("H,Hkv,hd,S", [(4, 1, 256, 37), (8, 2, 512, 5), (2, 2, 16, 600)])
def test_decode_attention(dtype, tol, H, Hkv, hd, S):
    g = torch.Generator().manual_seed(H * hd + S)
    slots = S + 11  # the kernel reads S slots of a larger cache buffer
    k = torch.randn(Hkv, slots, hd, generator=g).to(dtype)
    v = torch.randn(Hkv, slots, hd, generator=g).to(dtype)
    q = torch.randn(H, 1, hd, generator=g).to(dtype)
    got = attend_decode(q, k, v, S, 0, 0.1)
    ref = _torch_attend(q.double(), k[:, :S].double(), v[:, :S].double(), 0.1)
    assert (got.double() - ref).abs().max() < tol
    # a wrapped ring: the keys from slot `first` on, modulo the slots, in that order
    first = slots - 3
    idx = torch.remainder(torch.arange(first, first + S), slots)
    got = attend_decode(q, k, v, S, first, 0.1)
    ref = _torch_attend(q.double(), k[:, idx].double(), v[:, idx].double(), 0.1)
    assert (got.double() - ref).abs().max() < tol
    # position order makes the result independent of where the keys sit
    shifted_k, shifted_v = torch.roll(k, 5, dims=1), torch.roll(v, 5, dims=1)
    assert torch.equal(attend_decode(q, shifted_k, shifted_v, S, (first + 5) % slots, 0.1), got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,hd", [(4, 1, 256), (8, 1, 64), (6, 2, 16)])
def test_decode_attention_rows_are_row_invariant(dtype, H, Hkv, hd):
    """A batched step's rows in one call: each row, over its own sequence's buffers, has the
    bits it gets alone, whatever the other rows' lengths, rings and sequences."""
    g = torch.Generator().manual_seed(H + hd)
    slots = 300
    pool_k = torch.randn(3, Hkv, slots, hd, generator=g).to(dtype)  # 3 sequences' buffers
    pool_v = torch.randn(3, Hkv, slots, hd, generator=g).to(dtype)
    seq, S, first = [2, 0, 2, 1, 0], [1, 299, 37, 120, 3], [0, 0, 290, 17, 296]  # rows 0, 2: one sequence
    q = torch.randn(H, len(seq), hd, generator=g).to(dtype)
    got = attend_decode_rows(q, [pool_k[i] for i in seq], [pool_v[i] for i in seq], S, first, 0.1)
    for t, i in enumerate(seq):
        alone = attend_decode(q[:, t : t + 1], pool_k[i], pool_v[i], S[t], first[t], 0.1)
        assert torch.equal(got[:, t : t + 1], alone), t


def test_bandwidth_probe_reads():
    from fastgemma.bench.bandwidth import read_bandwidth_gb_s

    assert read_bandwidth_gb_s(size_mib=64, repetitions=3) > 0.1


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("with_scale", [True, False])
def test_rms_norm(dtype, tol, with_scale):
    from fastgemma.kernels.norm import native_rms_norm
    from fastgemma.models.layers import RMSNorm

    norm = RMSNorm(640, 1e-6, with_scale=with_scale)
    if with_scale:
        norm.scale.copy_(torch.rand(640) * 2)
    x = (torch.randn(3, 640) * 5).to(dtype)
    ref = norm(x)  # torch maths (use_native is off)
    got = native_rms_norm(x, norm.scale, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    assert ((got.float() - ref.float()).abs() <= tol * ref.float().abs().clamp(min=1)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_rows_are_row_invariant(dtype):
    """A prompt-sized call (its rows split over the threads) gives each row the bits it gets alone."""
    from fastgemma.kernels.norm import native_rms_norm

    scale = torch.rand(256) * 2
    x = (torch.randn(700, 256) * 5).to(dtype)  # 179200 values: past the threads' threshold
    got = native_rms_norm(x, scale, 1e-6)
    for r in (0, 1, 350, 699):
        assert torch.equal(got[r : r + 1], native_rms_norm(x[r : r + 1], scale, 1e-6)), r
