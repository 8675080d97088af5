"""models/layers.py and kernels/activation.py: the bf16 GELU is a function of each value alone,
it is torch's, and the MLP's fused gelu(gate) * up has the bits of the two torch ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastgemma.kernels import native
from fastgemma.kernels.activation import gelu_tanh, gelu_tanh_mul, gelu_tanh_table


def _every_bf16() -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_bf16_gelu_does_not_depend_on_where_a_value_sits():
    x = _every_bf16()
    finite = torch.isfinite(x)
    perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))
    a, b = gelu_tanh(x), gelu_tanh(x[perm])
    assert torch.equal(a[perm][finite[perm]].view(torch.int16), b[finite[perm]].view(torch.int16))
    assert gelu_tanh(x[:7]).shape == (7,) and gelu_tanh(x.view(256, 256)).shape == (256, 256)


def test_bf16_gelu_table_is_torchs_gelu():
    x = _every_bf16()
    finite = torch.isfinite(x)
    ref = F.gelu(x.float(), approximate="tanh")
    table = gelu_tanh_table()[x.view(torch.int16).long() + 2**15].float()
    # bf16 rounding of the fp32 function, up to torch's own tanh approximations
    assert ((table - ref).abs()[finite] <= ref.abs()[finite] * 2**-7 + 1e-6).all()


@pytest.mark.parametrize("rows", [1, 3, 263])
def test_bf16_gelu_mul_is_the_torch_ops(rows):
    """gelu_tanh_mul (native for bf16 where the library loads) = table lookup, then torch's bf16
    product, for every bf16 gate (NaNs and infinities too) against ups of every scale: the
    same bits, NaNs apart (a NaN's payload: torch's own vector and scalar loops differ there)."""
    g = torch.Generator().manual_seed(rows)
    every = _every_bf16()
    gate = every[torch.randint(0, every.numel(), (rows, 2048), generator=g)]
    gate[0, : min(2048, every.numel())] = every[:2048]
    up = (torch.randn(rows, 2048, generator=g) * 10.0 ** torch.randint(-4, 5, (rows, 2048), generator=g)).bfloat16()
    up[0, :3] = torch.tensor([float("inf"), float("nan"), -0.0])
    got = gelu_tanh_mul(torch.cat([gate, up], dim=1), 2048)
    want = gelu_tanh_table()[gate.view(torch.int16).long() + 2**15] * up
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and nan.any()
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
def test_bf16_gelu_mul_runs_natively():
    calls = []
    lib = native.load()
    real = lib.gelu_mul_bf16
    try:
        lib.gelu_mul_bf16 = lambda *a: (calls.append(a), real(*a))
        gelu_tanh_mul(torch.zeros(2, 8, dtype=torch.bfloat16), 4)
    finally:
        lib.gelu_mul_bf16 = real
    assert len(calls) == 1


def test_fp32_gelu_is_torchs():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(gelu_tanh(x), F.gelu(x, approximate="tanh"))


def test_a_grown_rope_table_has_the_rows_of_a_shorter_one():
    """Tables grow with the positions used (models/gemma.py `reserve_positions`): a longer
    table's first rows are the shorter one's, bit for bit, for both RoPE kinds of Gemma 4."""
    from fastgemma.models.layers import ROPE_BLOCK, rope_table
    from fastgemma.models.spec import arch_spec_from_config
    from tests import tiny_models

    spec = arch_spec_from_config(tiny_models.gemma4_e4b_like_config())
    for kind, rope in spec.rope.items():
        hd = next(layer.head_dim for layer in spec.layers if layer.layer_type == kind)
        short = rope_table(rope, hd, ROPE_BLOCK)
        long = rope_table(rope, hd, 2 * ROPE_BLOCK + 5)
        assert long[0].shape == (2 * ROPE_BLOCK + 5, hd)
        assert torch.equal(long[0][:ROPE_BLOCK], short[0]) and torch.equal(long[1][:ROPE_BLOCK], short[1])
        # and the rows of a table computed in one op, as before the tables grew
        from fastgemma.models.layers import rope_inv_freq

        freqs = torch.arange(2 * ROPE_BLOCK + 5).float()[:, None] * rope_inv_freq(rope, hd)[None, :]
        whole = torch.cat([freqs, freqs], dim=-1)
        assert torch.equal(long[0], whole.cos()) and torch.equal(long[1], whole.sin())
