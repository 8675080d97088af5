"""Gemma self-attention over the static cache: fused QKV, q/k/v norms, RoPE, GQA.

Owns one layer's projections and the attention maths. The cache decides which keys exist
(`KVCache.update`, `AttentionMetadata.masks`); KV-shared layers get their source layer's
keys and values handed in and own no K/V weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastgemma import kernels
from fastgemma.kernels.attention import attend_decode_rows
from fastgemma.kernels.linear import Linear
from fastgemma.models.kv_cache import AttentionMetadata, KVCache
from fastgemma.models.layers import RMSNorm, apply_rope
from fastgemma.models.spec import ArchSpec

KV = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    def __init__(self, spec: ArchSpec, layer_idx: int, native: bool = False):
        super().__init__()
        self.use_native = native  # single-query attention through kernels/cpu_attention.c
        layer = spec.layers[layer_idx]
        self.layer_idx, self.kv_shared, self.k_eq_v = layer_idx, layer.kv_shared, layer.k_eq_v
        self.layer_type, self.kv_source, self.is_sliding = layer.layer_type, layer.kv_source, layer.is_sliding
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, layer.num_kv_heads, layer.head_dim
        self.scaling, self.softcap = spec.attn_scaling, spec.attn_softcap
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        # Fused projection rows: [q | k | v]; a shared layer has only q, a k_eq_v layer no v.
        self.q_size, self.kv_size = q_out, (0 if self.kv_shared else kv_out)
        num_v = 0 if (self.kv_shared or self.k_eq_v) else kv_out
        self.qkv_proj = Linear(spec.hidden_size, q_out + self.kv_size + num_v, native)
        self.o_proj = Linear(q_out, spec.hidden_size, native)
        use_rsqrt = spec.family == "gemma3"
        eps = spec.rms_norm_eps
        self.q_norm = RMSNorm(self.head_dim, eps, use_rsqrt=use_rsqrt, native=native)
        self.k_norm = None if self.kv_shared else RMSNorm(self.head_dim, eps, use_rsqrt=use_rsqrt, native=native)
        self.v_norm = (
            RMSNorm(self.head_dim, eps, with_scale=False, use_rsqrt=use_rsqrt, native=native)
            if spec.v_norm and not self.kv_shared
            else None
        )

    def forward(
        self,
        x: torch.Tensor,  # [T, D]
        cos: torch.Tensor,  # [T, hd]
        sin: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
        shared_kv: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, q + k (+ v)]
        q = qkv[:, : self.q_size].view(T, self.num_heads, self.head_dim)
        q = apply_rope(self.q_norm(q), cos, sin).transpose(0, 1)  # [H, T, hd]
        native_decode = self.use_native and meta.decode_like and self.softcap is None
        if not self.kv_shared:
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, self.num_kv_heads, self.head_dim)
            v = k if self.k_eq_v else qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
            k = apply_rope(self.k_norm(k), cos, sin)
            if self.v_norm is not None:
                v = self.v_norm(v)
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, T, hd]
        if meta.in_place:
            # A fixed-shape step (engine/static_step.py): write at device-side slots, then each
            # query over its own visible keys (models/kv_cache.py).
            if not self.kv_shared:
                cache.scatter(self.layer_idx, k, v, meta)
            keys, values = cache.k[self.kv_source], cache.v[self.kv_source]  # [Hkv, slots + 1, hd]
            # CUDA: kernels/cuda_attention.py (each row over its own context); else masked
            # attention over the whole buffers
            if kernels.use_triton(q) and self.softcap is None:
                from fastgemma.kernels.cuda_attention import attend_in_place  # Triton: imported on CUDA only

                out = attend_in_place(q, keys, values, meta.positions, meta.valid, self.is_sliding, cache.ring,
                                      cache.window, self.scaling)  # [H, T, hd]
            else:
                mask = cache.in_place_mask(meta, self.layer_type)
                out = attend(q, keys, values, mask, self.scaling, self.softcap, eager=True)  # [H, T, hd]
        elif native_decode:
            # Every row's K/V written at its own sequence's slot, then each query on its own
            # over its visible keys, straight from its sequence's buffers (fastgemma's CPU
            # kernel): the same per row for any T and any neighbours (models/kv_cache.py).
            caches, positions = meta.row_caches, meta.row_positions
            if not self.kv_shared:
                for t in range(T):
                    caches[t].write_row(self.layer_idx, k[:, t], v[:, t], positions[t])
            S, first = zip(*(c.visible_keys(self.is_sliding, p) for c, p in zip(caches, positions)))
            out = attend_decode_rows(q, [c.k[self.kv_source] for c in caches], [c.v[self.kv_source] for c in caches],
                                     list(S), list(first), self.scaling)  # [H, T, hd]
            keys = values = None  # per sequence: a KV-shared layer reads its source from the cache
        else:
            if self.kv_shared:
                assert shared_kv is not None, f"layer {self.layer_idx} is KV-shared but got no K/V"
                keys, values = shared_kv
            else:
                keys, values = cache.update(self.layer_idx, k, v, meta)  # [Hkv, S, hd]
            assert T == 1 or not meta.decode_like, "decode-like chunks need the native attention kernel"
            out = attend(q, keys, values, meta.masks[self.layer_type], self.scaling, self.softcap)  # [H, T, hd]
        out = self.o_proj(out.transpose(0, 1).reshape(T, self.num_heads * self.head_dim))
        return out, (keys, values)


def attend(
    q: torch.Tensor,  # [H, T, hd]
    k: torch.Tensor,  # [Hkv, S, hd]
    v: torch.Tensor,  # [Hkv, S, hd]
    mask: torch.Tensor | None,  # [T, S] bool, True = visible; None = every key visible
    scaling: float,
    softcap: float | None,
    eager: bool = False,
) -> torch.Tensor:
    """`eager`: always the explicit matmul-softmax-matmul below (fixed-shape steps: plain
    batched GEMMs and a row-wise softmax, whose rows share no reduction). Otherwise a prompt
    chunk takes `_attend_blocks` on CPU and SDPA elsewhere."""
    H, T, hd = q.shape
    Hkv = k.shape[0]
    if T == 1 or softcap is not None or eager:
        # Decode (and softcapped configs): the reference's eager maths, with the query heads
        # of each KV head stacked as rows so GQA needs no copy of K/V.
        qg = q.reshape(Hkv, (H // Hkv) * T, hd)  # [Hkv, G*T, hd] (rows: head-major, then t)
        scores = (qg @ k.transpose(1, 2)) * scaling  # [Hkv, G*T, S]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores.view(Hkv, H // Hkv, T, -1).masked_fill(~mask, float("-inf")).view_as(scores)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return (probs @ v).view(H, T, hd)
    if q.device.type == "cpu":
        return _attend_blocks(q, k, v, mask, scaling)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=True)


ATTEND_BLOCK_ROWS = 128  # a prompt chunk's queries a block (_attend_blocks)


def _attend_blocks(
    q: torch.Tensor,  # [H, T, hd]
    k: torch.Tensor,  # [Hkv, S, hd]
    v: torch.Tensor,  # [Hkv, S, hd]
    mask: torch.Tensor | None,  # [T, S] bool, True = visible; None = every key visible
    scaling: float,
) -> torch.Tensor:  # [H, T, hd]
    """A prompt chunk's attention on CPU: fp32 scores, softmax and sums (as SDPA's math path,
    which upcasts to fp32 too, and which this replaces), the query heads of a
    KV head stacked as rows of one product (no copy of K/V for GQA), in blocks of
    ATTEND_BLOCK_ROWS queries, each over the range of keys its rows see (a causal block skips
    the keys after its last row; a sliding one those before its first row's window), so the
    scores held are bounded. A chunk's blocks and ranges depend only on its mask, so its
    numbers are the same whichever steps it runs in."""
    H, T, hd = q.shape
    Hkv, S, _ = k.shape
    G = H // Hkv
    qg = q.reshape(Hkv, G, T, hd)
    out = torch.empty(Hkv, G, T, hd, dtype=q.dtype)
    for b0 in range(0, T, ATTEND_BLOCK_ROWS):
        b1 = min(T, b0 + ATTEND_BLOCK_ROWS)
        lo, hi, seen = 0, S, None
        if mask is not None:
            cols = mask[b0:b1].any(0).nonzero()  # [n, 1]: keys some row of the block sees
            lo, hi = int(cols[0]), int(cols[-1]) + 1
            seen = mask[b0:b1, lo:hi]  # [B, hi - lo]
        qb = qg[:, :, b0:b1].float().reshape(Hkv, G * (b1 - b0), hd)
        scores = (qb @ k[:, lo:hi].float().transpose(1, 2)) * scaling  # [Hkv, G*B, hi - lo]
        if seen is not None:
            scores.view(Hkv, G, b1 - b0, hi - lo).masked_fill_(~seen, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[:, :, b0:b1] = (probs @ v[:, lo:hi].float()).view(Hkv, G, b1 - b0, hd)
    return out.view(H, T, hd)
