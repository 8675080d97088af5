"""models/layers.py: the bf16 GELU is a function of each value alone, and it is torch's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastgemma.kernels.activation import gelu_tanh, gelu_tanh_table


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
