"""The GGUF block kernels (kernels/gguf.py, cpu_gguf_gemv.c) on random blocks of every type
they read: the dense matrix is gguf-py's dequantisation bit for bit, products are that
matrix's to fp32 accuracy, every row's result is the same whatever else is in the call, and
a fused matrix's parts write their own columns."""

from __future__ import annotations

import gguf as gguf_py
import numpy as np
import pytest
import torch

from fastgemma.kernels import gguf, native

lib = native.load()
pytestmark = pytest.mark.skipif(lib is None, reason="fastgemma's native CPU kernels do not build here")


def random_blocks(ggml_type: int, N: int, K: int, seed: int = 0) -> np.ndarray:
    """[N, row bytes] uint8: legacy types quantised from Gaussian weights by gguf-py; K-quants
    (which gguf-py cannot quantise) as random bytes with finite, modest fp16 scales."""
    rng = np.random.default_rng(seed)
    qtype = gguf_py.GGMLQuantizationType(ggml_type)
    if ggml_type in (2, 6, 8):
        return gguf_py.quants.quantize(rng.standard_normal((N, K)).astype(np.float32), qtype)
    _, weights, nbytes = gguf.KERNEL_TYPES[ggml_type]
    raw = rng.integers(0, 256, (N, K // weights, nbytes), dtype=np.uint8)

    def f16(lo, hi):
        return np.frombuffer(rng.uniform(lo, hi, (N, K // weights)).astype(np.float16).tobytes(), np.uint8)

    if ggml_type == 12:  # Q4_K: d, dmin first
        raw[..., 0:2] = f16(0.001, 0.02).reshape(N, -1, 2)
        raw[..., 2:4] = f16(0.001, 0.02).reshape(N, -1, 2)
    else:  # Q6_K: d last
        raw[..., 208:210] = f16(0.0001, 0.002).reshape(N, -1, 2)
    return raw.reshape(N, -1)


def dequantized(blocks: np.ndarray, ggml_type: int) -> torch.Tensor:
    return torch.from_numpy(gguf_py.quants.dequantize(blocks, gguf_py.GGMLQuantizationType(ggml_type)))


TYPES = sorted(gguf.KERNEL_TYPES)


@pytest.mark.parametrize("ggml_type", TYPES, ids=[gguf.KERNEL_TYPES[t][0] for t in TYPES])
@pytest.mark.parametrize("K", [256, 768, 2048])
def test_blocks_are_the_files_matrix(ggml_type, K):
    N = 37
    raw = random_blocks(ggml_type, N, K)
    blocks, layout = torch.from_numpy(raw.copy()).reshape(-1), torch.tensor([[ggml_type, N]])
    ref = dequantized(raw, ggml_type)
    assert torch.equal(gguf.dequantize(blocks, layout, K, torch.float32, lib), ref)
    assert torch.equal(gguf.dequantize(blocks, layout, K, torch.bfloat16, lib), ref.bfloat16())
    assert torch.equal(gguf.dequantize(blocks, layout, K, torch.float32, None), ref)  # gguf-py's path

    x = torch.randn(9, K)
    y = gguf.matvec(x, blocks, layout, lib)
    exact = x.double() @ ref.double().T
    scale = x.abs().double() @ ref.abs().double().T
    assert ((y.double() - exact).abs() / scale).max() < 1e-5
    for M in range(1, 9):  # every tile size: a row's bits do not depend on its neighbours
        assert torch.equal(gguf.matvec(x[9 - M :], blocks, layout, lib), y[9 - M :])
    xb = x.bfloat16()
    assert torch.equal(gguf.matvec(xb, blocks, layout, lib), gguf.matvec(xb.float(), blocks, layout, lib).bfloat16())


def test_parts_write_their_columns():
    K = 512
    parts = [(6, 24), (8, 8), (14, 16), (12, 8)]  # a q/k/v-like fusion of mixed types
    raws = [random_blocks(t, n, K, seed=i) for i, (t, n) in enumerate(parts)]
    blocks = torch.from_numpy(np.concatenate([r.reshape(-1) for r in raws]).copy())
    layout = torch.tensor(parts)
    x = torch.randn(3, K)
    y = gguf.matvec(x, blocks, layout, lib)
    alone = [gguf.matvec(x, torch.from_numpy(r.copy()).reshape(-1), torch.tensor([p]), lib) for r, p in zip(raws, parts)]
    assert torch.equal(y, torch.cat(alone, dim=1))
    dense = torch.cat([dequantized(r, t) for r, (t, _) in zip(raws, parts)])
    assert torch.equal(gguf.dequantize(blocks, layout, K, torch.float32, lib), dense)


def test_fits():
    assert gguf.fits(6, 640) and gguf.fits(8, 32)
    assert not gguf.fits(12, 640)  # K-quants need whole 256-weight super-blocks
    assert not gguf.fits(13, 256)  # Q5_K: no kernel here
    assert not gguf.fits(0, 256)  # F32
