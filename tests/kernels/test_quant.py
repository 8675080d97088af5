"""Quantisation schemes (kernels/quant.py) and the quantised GEMVs (cpu_quant_gemv.c).

The GEMVs must compute the dequantised matrix times x: against an fp64 product with the
dequantised matrix, within the fp32 summation bound g * sum |w x| (+ one bf16 rounding).
"""

from __future__ import annotations

import pytest
import torch

from fastgemma.kernels import native, quant
from fastgemma.kernels.linear import Linear
from fastgemma.kernels.quant import QuantScheme

SCHEMES = [QuantScheme.parse(n) for n in ("int8", "int4-g32", "int4-g128")]
needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")


def test_parse_rejects_unknown_scheme():
    assert QuantScheme.parse("none") is None
    with pytest.raises(ValueError, match="int4-g32"):
        QuantScheme.parse("int3")


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_dequantised_matrix_is_close_to_the_weight(scheme):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * torch.rand(64, 1, generator=g)  # rows of different scales
    q, s = quant.quantize(w, scheme)
    deq = quant.dequantize(q, s, scheme, torch.float32)
    if scheme.bits == 8:
        assert q.dtype == torch.int8 and s.shape == (64,)
        assert ((deq - w).abs() <= s[:, None] / 2 * (1 + 1e-6)).all()  # round to nearest, no clipping
    else:
        assert q.dtype == torch.uint8 and q.shape == (64, 128) and s.shape == (64, 256 // scheme.group)
        rel = (deq - w).norm() / w.norm()
        assert rel < (0.12 if scheme.group == 32 else 0.16)  # 4-bit: ~1/16 of the group's range


def test_int4_packing_layout():
    """Byte j of a 32-weight block holds weight j (low nibble) and weight j + 16 (high)."""
    w = torch.arange(-8, 24, dtype=torch.float32)[None, :].clone()  # one row, one block
    w = torch.where(w > 7, w - 16, w)  # values in [-8, 7]: exact codes with d = 1
    q, s = quant.quantize(w, QuantScheme.parse("int4-g32"))
    d = float(s[0, 0])
    codes = torch.round(w / d) + 8
    assert int(q[0, 3]) == int(codes[0, 3]) | (int(codes[0, 19]) << 4)
    assert torch.equal(quant.dequantize(q, s, QuantScheme.parse("int4-g32"), torch.float32), torch.round(w / d) * d)


def _reference(x: torch.Tensor, deq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    exact = x.double() @ deq.double().t()
    bound = x.double().abs() @ deq.double().abs().t() * (deq.shape[1] + 2) * 2.0**-24
    return exact, bound


@needs_native
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("N,K", [(1, 128), (7, 640), (1030, 256), (13, 2048)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantised_gemv_matches_dequantised_matmul(scheme, N, K, dtype):
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g)
    x = torch.randn(1, K, generator=g).to(dtype)
    q, s = quant.quantize(w, scheme)
    got = quant.matvec(x, q, s, scheme, native.load())
    exact, bound = _reference(x, quant.dequantize(q, s, scheme, torch.float64))
    assert got.shape == (1, N) and got.dtype == dtype
    err = (got.double() - exact).abs()
    if dtype == torch.bfloat16:
        bound = bound + (exact.abs() + bound) * 2.0**-8  # plus the final rounding to bf16
    assert (err <= bound * 1.001 + 1e-30).all()


@needs_native
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
@pytest.mark.parametrize("K", [640, 2048, 47])
def test_quantised_gemv_rows_are_row_invariant(scheme, K):
    """Each row of a multi-row product has exactly the bits of that row alone, for every
    row count (int8 widens weights once for several rows: the chains must not change)."""
    if scheme.bits == 4 and K % scheme.group:
        pytest.skip("int4 needs K % group == 0")
    g = torch.Generator().manual_seed(K)
    q, s = quant.quantize(torch.randn(37, K, generator=g), scheme)
    x = torch.randn(16, K, generator=g)
    for M in (2, 3, 5, 7, 16):
        for dtype in (torch.float32, torch.bfloat16):
            xs = x[:M].to(dtype)
            rows = quant.matvec(xs, q, s, scheme, native.load())
            for m in range(M):
                assert torch.equal(rows[m], quant.matvec(xs[m : m + 1], q, s, scheme, native.load())[0])


@needs_native
def test_ragged_int8_tail():
    scheme = QuantScheme.parse("int8")
    for K in (1, 15, 17, 33, 47):
        w, x = torch.randn(5, K), torch.randn(1, K)
        q, s = quant.quantize(w, scheme)
        got = quant.matvec(x, q, s, scheme, native.load())
        exact, bound = _reference(x, quant.dequantize(q, s, scheme, torch.float64))
        assert ((got.double() - exact).abs() <= bound * 1.001 + 1e-30).all()


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_quantised_linear_prefill_and_decode_agree(scheme):
    """Large inputs use the dequantised matrix; decode-sized ones the GEMV: same values up to rounding."""
    torch.manual_seed(1)
    layer = Linear(256, 96, native=native.load() is not None)
    w = layer.weight.detach().clone()
    layer.quantize_(scheme)
    assert not hasattr(layer, "weight") or layer.__dict__.get("weight") is None
    assert layer.nbytes() < w.numel() * 4 * scheme.bits / 16
    x = torch.randn(20, 256)  # more than NATIVE_MAX_ROWS
    rows = layer(x)
    one = torch.cat([layer(x[i : i + 1]) for i in range(20)])
    assert torch.allclose(rows, one, rtol=1e-5, atol=1e-5)
    assert torch.allclose(rows, x @ quant.dequantize(layer.qweight, layer.scales, layer.scheme, torch.float32).t(), atol=1e-5)
    assert (rows - x @ w.t()).abs().max() < 0.25 * (x @ w.t()).abs().max()


def test_int4_falls_back_to_int8_for_ragged_inputs():
    layer = Linear(48, 8)  # 48 is not a multiple of 32
    layer.quantize_(QuantScheme.parse("int4-g32"))
    assert layer.scheme.name == "int8"
