"""The static KV cache: allocated once, written in place, never resized.

Owns the K/V buffers of every layer that computes its own K/V, and the masks that say which
cached slots a query may see. It does not own the projections or the attention maths.

Layout (one sequence at a time, so no batch dimension):
- full layers: `[Hkv, max_model_len, hd]`, slot = position;
- sliding layers: a ring `[Hkv, W, hd]` (W = sliding_window), slot = position mod W.
  After positions 0..end-1 are written, slot s holds position
  `p_s = end-1 - ((end-1-s) mod W)` (valid when p_s >= 0) — derived from `end`, so the
  ring keeps no position table of its own;
- KV-shared layers (Gemma 4) have no buffers: they attend over their source layer's K/V.

Writing a chunk of T tokens at positions start..end-1:
- T == 1 (decode): write the slot, attend over every written slot (no mask needed: a ring
  holds exactly the last W positions, all visible);
- T > 1 on a ring: attend over [ring before the chunk ; the chunk's own K/V], then write the
  chunk's last min(T, W) tokens into the ring. Queries in the chunk may need positions the
  chunk is about to overwrite, hence attend-then-write.
A query at q sees key position k iff 0 <= k <= q, and on sliding layers q - k < W (itself and
W - 1 previous tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastgemma.models.spec import FULL, SLIDING, ArchSpec


@dataclass
class AttentionMetadata:
    """Where one forward's tokens sit, and what each layer type may attend to."""

    start: int  # position of the chunk's first token
    end: int  # one past the chunk's last token
    positions: torch.Tensor  # [T] int64
    masks: dict[str, torch.Tensor | None]  # layer type -> [T, S] bool (S = keys update() returns); None: all visible

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


class KVCache:
    def __init__(self, spec: ArchSpec, max_model_len: int, dtype: torch.dtype, device: torch.device):
        self.spec, self.max_model_len = spec, max_model_len
        self.window = spec.sliding_window
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        for i in spec.cache_layers:
            layer = spec.layers[i]
            slots = min(self.window, max_model_len) if layer.is_sliding else max_model_len
            shape = (layer.num_kv_heads, slots, layer.head_dim)
            self.k[i] = torch.zeros(shape, dtype=dtype, device=device)
            self.v[i] = torch.zeros(shape, dtype=dtype, device=device)
        self.device = device

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.k.values(), *self.v.values()])

    def ring_positions(self, end: int) -> torch.Tensor:
        """[min(W, max_model_len)] position held by each ring slot after writing 0..end-1 (-1: empty)."""
        slots = torch.arange(min(self.window, self.max_model_len), device=self.device)
        return (end - 1) - torch.remainder(end - 1 - slots, self.window)

    def metadata(self, start: int, num_tokens: int) -> AttentionMetadata:
        end = start + num_tokens
        if end > self.max_model_len:
            raise ValueError(f"sequence of {end} tokens exceeds max_model_len={self.max_model_len}")
        q = torch.arange(start, end, device=self.device)  # [T]
        layer_types = {layer.layer_type for layer in self.spec.layers}
        masks: dict[str, torch.Tensor | None] = {}
        if num_tokens == 1:
            # Decode: update() returns exactly the keys this query may see (full: 0..end-1;
            # ring: the last min(end, W) positions), so no mask is needed.
            return AttentionMetadata(start=start, end=end, positions=q, masks=dict.fromkeys(layer_types))
        if FULL in layer_types:
            k = torch.arange(end, device=self.device)  # [end]
            masks[FULL] = k[None, :] <= q[:, None]
        if SLIDING in layer_types:
            k = torch.cat([self.ring_positions(start)[: min(start, self.window)], q])
            masks[SLIDING] = (k[None, :] <= q[:, None]) & (k[None, :] >= 0) & (q[:, None] - k[None, :] < self.window)
        return AttentionMetadata(start=start, end=end, positions=q, masks=masks)

    def update(
        self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the chunk's k, v: [Hkv, T, hd]; return the keys/values to attend over: [Hkv, S, hd]."""
        ck, cv = self.k[layer_idx], self.v[layer_idx]
        start, end, T = meta.start, meta.end, meta.num_tokens
        assert k.shape[1] == T and v.shape[1] == T, (k.shape, T)
        if not self.spec.layers[layer_idx].is_sliding:
            ck[:, start:end] = k
            cv[:, start:end] = v
            return ck[:, :end], cv[:, :end]
        W = ck.shape[1]
        if T == 1:
            slot = start % W
            ck[:, slot] = k[:, 0]
            cv[:, slot] = v[:, 0]
            return ck[:, : min(end, W)], cv[:, : min(end, W)]  # until the ring fills, slot = position
        n_old = min(start, W)  # ring slots written before this chunk
        keys = torch.cat([ck[:, :n_old], k], dim=1)  # [Hkv, n_old + T, hd]
        values = torch.cat([cv[:, :n_old], v], dim=1)
        keep = min(T, W)
        slots = meta.positions[-keep:] % W
        ck[:, slots] = k[:, -keep:]
        cv[:, slots] = v[:, -keep:]
        return keys, values
