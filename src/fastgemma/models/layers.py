"""Small numerical building blocks of the Gemma decoders: RMSNorm and RoPE tables (GELU: kernels/activation.py).

Each function mirrors the reference's numerics exactly (fp32 norm statistics, cos/sin cast to
the compute dtype before rotation); the decoder composes them. No weights live here except
the norm scales, which are kept in fp32 with the family's offset already applied.
"""

from __future__ import annotations

import torch
from torch import nn

from fastgemma.kernels.norm import native_rms_norm
from fastgemma.models.spec import RopeSpec


class RMSNorm(nn.Module):
    """y = x / rms(x) * scale, statistics in fp32, result cast back to x's dtype.

    `scale` is stored in fp32 as (offset + w): Gemma 3 multiplies by (1 + w), Gemma 4 by w;
    both references compute `w.float()` from the weight in the model dtype, so the offset is
    added after rounding the checkpoint weight to that dtype (the loader fills `scale`).
    `with_scale=False` is Gemma 4's weightless norm (v-norm, embedder norms).
    Gemma 3 uses rsqrt, Gemma 4 pow(-0.5): both kept so results match bit for bit.
    """

    def __init__(self, dim: int, eps: float, with_scale: bool = True, use_rsqrt: bool = True, native: bool = False):
        super().__init__()
        self.eps, self.use_rsqrt = eps, use_rsqrt
        self.scale = nn.Buffer(torch.ones(dim, dtype=torch.float32)) if with_scale else None
        self.use_native = native  # kernels/cpu_norm.c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_native and (y := native_rms_norm(x, self.scale, self.eps)) is not None:
            return y
        xf = x.float()
        ms = xf.pow(2).mean(-1, keepdim=True) + self.eps
        y = xf * (torch.rsqrt(ms) if self.use_rsqrt else torch.pow(ms, -0.5))
        if self.scale is not None:
            y = y * self.scale
        return y.type_as(x)


def rope_inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """inv_freq: [head_dim // 2] (fp32), following transformers' rope init functions."""
    if rope.rope_type == "proportional":
        # Only the first `rope_angles` pairs rotate; their exponent uses the full head dim.
        rope_angles = int(rope.partial_rotary_factor * head_dim // 2)
        exps = torch.arange(0, 2 * rope_angles, 2, dtype=torch.int64, device="cpu").float() / head_dim
        inv = 1.0 / (rope.theta**exps)
        inv = torch.cat([inv, torch.zeros(head_dim // 2 - rope_angles, device="cpu")])
    else:
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        inv = 1.0 / (rope.theta**exps)
    return inv / rope.factor


ROPE_BLOCK = 4096  # positions computed per op: a table's rows do not depend on its length


def rope_table(rope: RopeSpec, head_dim: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_len, head_dim] fp32, duplicated halves (rotate_half convention).
    Computed in blocks of `ROPE_BLOCK` positions, each the same ops on the same shapes, so a
    longer table (grown later) has the same bits in the rows a shorter one had."""
    inv = rope_inv_freq(rope, head_dim)  # [hd/2]
    cos, sin = [], []
    for a in range(0, max_len, ROPE_BLOCK):
        pos = torch.arange(a, a + ROPE_BLOCK, dtype=torch.int64, device="cpu").float()
        freqs = pos[:, None] * inv[None, :]  # [B, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [B, hd]
        cos.append(emb.cos())
        sin.append(emb.sin())
    return torch.cat(cos)[:max_len], torch.cat(sin)[:max_len]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, hd]; cos/sin: [T, hd] in x's dtype. Half-split rotation: (x1, x2) -> (-x2, x1)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


