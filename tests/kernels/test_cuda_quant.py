"""The CUDA int8 / int4 matmul (kernels/cuda_quant.py): on a GPU when there is one, else the
same Triton kernel in Triton's interpreter on the CPU (tests/conftest.py; skipped without
triton installed)."""

from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytest.importorskip("triton")

from fastgemma.kernels import quant  # noqa: E402
from fastgemma.kernels.cuda_quant import BLOCK_M, quant_matmul, split_k  # noqa: E402

SHAPES = [(96, 64), (200, 256), (64, 1024), (40, 2048)]


@pytest.mark.parametrize("scheme_name", ["int8", "int4-g32", "int4-g128"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_dequantise_then_matmul(scheme_name, dtype):
    """Within the output dtype's rounding of the fp32 product with the dequantised matrix."""
    scheme = quant.QuantScheme.parse(scheme_name)
    g = torch.Generator().manual_seed(1)
    for N, K in SHAPES:
        if scheme.bits == 4 and K % scheme.group:
            continue
        qweight, scales = quant.quantize(torch.randn(N, K, generator=g), scheme)
        x = torch.randn(7, K, generator=g).to(dtype)
        ref = x.float() @ quant.dequantize(qweight, scales, scheme, torch.float32).T
        got = quant_matmul(x.to(DEVICE), qweight.to(DEVICE), scales.to(DEVICE), scheme).cpu()
        assert got.dtype == dtype and got.shape == (7, N)
        tol = 4e-3 if dtype == torch.bfloat16 else 1e-5  # bf16: one rounding of the output
        assert (got.float() - ref).abs().max() <= tol * ref.abs().max(), (N, K)


@pytest.mark.parametrize("scheme_name", ["int8", "int4-g32"])
def test_a_rows_result_does_not_depend_on_the_other_rows(scheme_name):
    """Row i of an M-row product equals the 1-row product of that row, bit for bit."""
    scheme = quant.QuantScheme.parse(scheme_name)
    g = torch.Generator().manual_seed(2)
    qweight, scales = (t.to(DEVICE) for t in quant.quantize(torch.randn(300, 512, generator=g), scheme))
    x = torch.randn(BLOCK_M, 512, generator=g).to(torch.bfloat16).to(DEVICE)
    full = quant_matmul(x, qweight, scales, scheme)
    for i in (0, 5, BLOCK_M - 1):
        assert torch.equal(quant_matmul(x[i : i + 1], qweight, scales, scheme)[0], full[i])


def test_split_k_depends_on_the_shape_only_and_divides_the_blocks():
    for N, K in [(2560, 2560), (20480, 2560), (2560, 10240), (64, 96), (96, 64)]:
        s = split_k(N, K)
        assert (K // 32) % s == 0 and s >= 1
