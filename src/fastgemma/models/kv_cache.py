"""The static KV cache: slots per sequence, written in place.

Owns the K/V buffers of every layer that computes its own K/V, and the masks that say which
cached slots a query may see. It does not own the projections or the attention maths. It
sits beside the model, which writes into it; the engine's runner allocates it and passes it in.

Sequences: a `KVCachePool` holds `num_seqs` static slots, one per running sequence (gpt-fast
style): each buffer is `[num_seqs, ...]` and `pool.seqs[i]` is the `KVCache` of slot i, a view
of row i of every buffer. A slot is a sequence's own from prefill to finish; nothing a
neighbour does reaches it. Why static slots rather than vLLM's paged blocks: 5 of every 6
Gemma layers are sliding rings, which are per sequence whatever the layout (a ring is
overwritten as the sequence advances), and the full layers are the rest; a shared prompt is
then a copy into another slot, a bandwidth-bound copy far cheaper than the prefill it saves,
giving the same bits as computing it: n choices of one prompt copy the computed slot
(`KVCachePool.copy`), prefix caching keeps computed chunks out of a slot and loads them into
another (`save_chunk` / `load_prefix`: a chunk's full-layer positions and the rings after
it). What paging would save is the full layers' unused tail per slot; instead a pool sizes
the full layers to what is used: `capacity` positions per slot,
starting at `INITIAL_CAPACITY` and doubled (up to max_model_len) when a chunk or row would
reach past it — the buffers are reallocated with the old contents copied, between forwards
(`KVCachePool.reserve`, called by `metadata` / `decode_metadata`); `generation` counts the
reallocations, so that whoever keeps buffer addresses (kernels/decode_layers.py) knows to
take them again. A pool for
fixed-shape steps (scratch slot: CUDA graphs keep addresses) is allocated whole.

Layout of one sequence's cache (`KVCache`; no batch dimension):
- full layers: `[Hkv, capacity, hd]`, slot = position;
- sliding layers: a ring `[Hkv, R, hd]` with R = W + spare slots (W = sliding_window; spare
  = the most speculative tokens a step verifies, else 0), slot = position mod R.
  After positions 0..end-1 are written, slot s holds position
  `p_s = end-1 - ((end-1-s) mod R)` (valid when p_s >= 0) — derived from `end`, so the
  ring keeps no position table of its own;
- KV-shared layers (Gemma 4) have no buffers: they attend over their source layer's K/V.
A query at q sees key position k iff 0 <= k <= q, and on sliding layers q - k < W (itself and
W - 1 previous tokens).

Two ways to run a chunk of T tokens at positions start..end-1:
- decode-like (`metadata(..., decode_like=True)`; always for T == 1): `write` all T tokens'
  K/V at their slots, then each query attends alone over `visible_keys(layer, q)`: S keys
  from slot `first` on, in position order. A speculative verification (T = K + 1) runs so,
  which makes each row the one-token step's, bit for bit. It needs R >= W + T - 1 (then the
  chunk's writes overwrite only positions < start - W + 1, which no query of the chunk or
  after sees) — hence the spare slots; rejected tokens' K/V are simply overwritten later
  (full layers: never read before; ring: same argument).
- prefill (T > 1): attend over [ring before the chunk ; the chunk's own K/V] with a mask,
  then write the chunk's last min(T, R) tokens into the ring. Queries in the chunk may need
  positions the chunk is about to overwrite, hence attend-then-write.
A third, for fixed-shape steps (engine/static_step.py, CUDA graphs): `in_place_metadata`
describes a decode-like chunk by device tensors only (no Python positions), `scatter` writes
its K/V at position (full) or position mod R (ring), then each query attends over exactly
its visible positions — read from those slots by kernels/cuda_attention.py on CUDA, or with a
mask over the layer's *whole* buffer elsewhere: full layers see slots s <= q; a ring slot s
holds position q - ((q - s) mod R) within the query's window (the argument above: no slot in
that window is stale), so it is visible iff (q - s) mod R < min(W, q + 1). Such a cache has
one scratch slot past the end of every buffer (`scratch_slot=True`), never visible, where
padding rows write.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastgemma.models.spec import FULL, SLIDING, ArchSpec


@dataclass
class AttentionMetadata:
    """Where one forward's tokens sit, and what each layer type may attend to.

    A decode-like forward may hold rows of several sequences (continuous batching): row t is
    token `row_positions[t]` of the sequence whose cache is `row_caches[t]`; the forward's own
    `cache` argument is then unused by attention."""

    start: int  # position of the chunk's first token
    end: int  # one past the chunk's last token
    positions: torch.Tensor  # [T] int64
    masks: dict[str, torch.Tensor | None]  # layer type -> [T, S] bool (S = keys update() returns); None: all visible
    # (in place: filled on first use by KVCache.in_place_mask)
    decode_like: bool = False  # every token as its own decode step (write, then attend one by one)
    # in place (fixed shapes): start/end are unknown to the host (-1); `slots` says where each
    # row's K/V go (layer type -> [T] int64), masks cover whole buffers (module docstring)
    slots: dict[str, torch.Tensor] | None = None
    valid: torch.Tensor | None = None  # in place: [T] bool, False for padding rows
    # decode-like: each row's sequence cache and position (host side; the same cache for
    # every row of a one-sequence chunk)
    row_caches: list[KVCache] | None = None
    row_positions: list[int] | None = None

    @property
    def in_place(self) -> bool:
        return self.slots is not None

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


class KVCache:
    def __init__(
        self,
        spec: ArchSpec,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
        spare_ring_slots: int = 0,
        scratch_slot: bool = False,  # one never-visible slot past each buffer's end (in-place steps)
        buffers: tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]] | None = None,  # a pool's views
        index: int = 0,  # the slot of a pool this cache is
        capacity: int | None = None,  # full layers' slots (default max_model_len; a pool's grow)
    ):
        self.spec, self.max_model_len = spec, max_model_len
        self.capacity = max_model_len if capacity is None else capacity
        self.window = spec.sliding_window
        self.ring = min(self.window + spare_ring_slots, max_model_len)  # R: slots of a sliding layer
        self.scratch_slot, self.index = scratch_slot, index
        self.pool: KVCachePool | None = None  # set by the pool this cache is a slot of
        self.k: dict[int, torch.Tensor] = {}  # layer -> [Hkv, slots (+ 1), hd]
        self.v: dict[int, torch.Tensor] = {}
        if buffers is not None:
            self.k, self.v = buffers
        else:
            for i, shape in self.buffer_shapes().items():
                self.k[i] = torch.zeros(shape, dtype=dtype, device=device)
                self.v[i] = torch.zeros(shape, dtype=dtype, device=device)
        self.device = device

    def buffer_shapes(self) -> dict[int, tuple[int, int, int]]:
        """layer -> (Hkv, slots, hd) of each K and V buffer of one sequence."""
        shapes = {}
        for i in self.spec.cache_layers:
            layer = self.spec.layers[i]
            shapes[i] = (layer.num_kv_heads, self.slots(layer.is_sliding) + int(self.scratch_slot), layer.head_dim)
        return shapes

    def slots(self, sliding: bool) -> int:
        """Position slots of a layer's buffer (R or capacity; the scratch slot not counted)."""
        return self.ring if sliding else self.capacity

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.k.values(), *self.v.values()])

    @property
    def max_decode_like_tokens(self) -> int:
        """The most tokens one decode-like chunk may hold (R >= W + T - 1 on rings)."""
        if not any(layer.is_sliding for layer in self.spec.layers) or self.ring >= self.max_model_len:
            return self.max_model_len
        return self.ring - self.window + 1

    def ring_positions(self, end: int) -> torch.Tensor:
        """[R] position held by each ring slot after writing 0..end-1 (-1: empty)."""
        slots = torch.arange(self.ring, device=self.device)
        return (end - 1) - torch.remainder(end - 1 - slots, self.ring)

    def visible_keys(self, sliding: bool, position: int) -> tuple[int, int]:
        """(S, first): the query at `position` sees the S keys in slots first, first + 1, ...
        (mod the buffer's slots), oldest first."""
        if not sliding:
            return position + 1, 0
        S = min(position + 1, self.window)
        return S, (position + 1 - S) % self.ring

    def context(self, layer_idx: int, position: int, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [Hkv, S, hd] of positions max(0, position - window)..position - 1 (window None:
        from 0), oldest first: what an MTP assistant's query at `position` attends over
        (models/assistant.py). On a ring the oldest of them must not have been overwritten yet:
        a verification of K drafts from position - 1 writes up to position - 1 + K, so R >=
        window + K keeps them (engine/mtp.py: window W + 1, hence K + 1 spare slots)."""
        ck, cv = self.k[layer_idx], self.v[layer_idx]
        first = 0 if window is None else max(0, position - window)
        if not self.spec.layers[layer_idx].is_sliding:
            return ck[:, first:position], cv[:, first:position]
        assert position - first <= self.ring, (position, first, self.ring)
        idx = torch.remainder(torch.arange(first, position, device=ck.device), self.ring)
        return ck[:, idx], cv[:, idx]

    def reserve(self, positions: int) -> None:
        """Full layers hold positions 0..positions-1 (a pool grows; a lone cache is whole)."""
        if positions > self.max_model_len:
            raise ValueError(f"sequence of {positions} tokens exceeds max_model_len={self.max_model_len}")
        if positions > self.capacity:
            assert self.pool is not None, "a standalone cache is allocated whole"
            self.pool.reserve(positions)

    def metadata(self, start: int, num_tokens: int, decode_like: bool | None = None) -> AttentionMetadata:
        end = start + num_tokens
        self.reserve(end)
        q = torch.arange(start, end, device=self.device)  # [T]
        layer_types = {layer.layer_type for layer in self.spec.layers}
        masks: dict[str, torch.Tensor | None] = {}
        if num_tokens == 1 or decode_like:
            if num_tokens > self.max_decode_like_tokens:
                raise ValueError(
                    f"{num_tokens} decode-like tokens need {num_tokens - 1} spare ring slots; the cache has "
                    f"{self.ring - self.window}"
                )
            # Each query sees exactly visible_keys(); no mask is needed.
            return AttentionMetadata(start, end, q, dict.fromkeys(layer_types), decode_like=True,
                                     row_caches=[self] * num_tokens, row_positions=list(range(start, end)))
        if FULL in layer_types:
            k = torch.arange(end, device=self.device)  # [end]
            masks[FULL] = k[None, :] <= q[:, None]
        if SLIDING in layer_types:
            k = torch.cat([self.ring_positions(start)[: min(start, self.ring)], q])
            masks[SLIDING] = (k[None, :] <= q[:, None]) & (k[None, :] >= 0) & (q[:, None] - k[None, :] < self.window)
        return AttentionMetadata(start=start, end=end, positions=q, masks=masks)

    def in_place_metadata(
        self, positions: torch.Tensor, full_slots: torch.Tensor, ring_slots: torch.Tensor
    ) -> AttentionMetadata:
        """A decode-like chunk for a fixed-shape step, from device tensors only: positions [T]
        (every row's, padding included), the slots its K/V go to [T] (full / ring buffers;
        padding rows: the scratch slot). Its masks are made on first use (`in_place_mask`):
        the CUDA attention kernel reads positions, not masks."""
        assert self.scratch_slot, "in-place steps need a cache built with scratch_slot=True"
        slots = {FULL: full_slots, SLIDING: ring_slots}
        valid = full_slots < self.max_model_len  # padding rows write the scratch slot
        return AttentionMetadata(-1, -1, positions, {}, decode_like=False, slots=slots, valid=valid)

    def in_place_mask(self, meta: AttentionMetadata, layer_type: str) -> torch.Tensor:
        """[T, slots + 1] bool: which slots of a whole buffer each query of an in-place chunk
        sees (module docstring); made once per chunk and layer type."""
        if layer_type not in meta.masks:
            q = meta.positions[:, None]  # [T, 1]
            if layer_type == FULL:
                s = torch.arange(self.max_model_len + 1, device=self.device)[None, :]  # [1, S + 1]
                meta.masks[FULL] = (s <= q) & (s < self.max_model_len)
            else:
                s = torch.arange(self.ring + 1, device=self.device)[None, :]  # [1, R + 1]
                back = torch.remainder(q - s, self.ring)  # how far back from q slot s's position is
                meta.masks[SLIDING] = (back < self.window) & (back <= q) & (s < self.ring)
        return meta.masks[layer_type]

    def scatter(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store an in-place chunk's k, v: [Hkv, T, hd] at `meta.slots` (device-side indices)."""
        assert meta.slots is not None
        slots = meta.slots[self.spec.layers[layer_idx].layer_type]
        self.k[layer_idx].index_copy_(1, slots, k)
        self.v[layer_idx].index_copy_(1, slots, v)

    def write_row(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, position: int) -> None:
        """Store one token's k, v: [Hkv, hd] at its slot."""
        slot = position % self.ring if self.spec.layers[layer_idx].is_sliding else position
        self.k[layer_idx][:, slot], self.v[layer_idx][:, slot] = k, v

    def write(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
        """Store a decode-like chunk's k, v: [Hkv, T, hd] at their slots."""
        ck, cv = self.k[layer_idx], self.v[layer_idx]
        if self.spec.layers[layer_idx].is_sliding:
            slots = meta.positions % self.ring
            ck[:, slots], cv[:, slots] = k, v
        else:
            ck[:, meta.start : meta.end], cv[:, meta.start : meta.end] = k, v

    def update(
        self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the chunk's k, v: [Hkv, T, hd]; return the keys/values to attend over: [Hkv, S, hd]
        (a decode step: the visible keys; a prefill chunk: keys for `meta.masks`)."""
        ck, cv = self.k[layer_idx], self.v[layer_idx]
        start, end, T = meta.start, meta.end, meta.num_tokens
        assert k.shape[1] == T and v.shape[1] == T, (k.shape, T)
        sliding = self.spec.layers[layer_idx].is_sliding
        if meta.decode_like:
            assert T == 1, "decode-like chunks of several tokens attend query by query (models/attention.py)"
            self.write(layer_idx, k, v, meta)
            S, first = self.visible_keys(sliding, start)
            slots = self.slots(sliding)
            if S == ck.shape[1]:  # every slot visible (a full ring without spare slots)
                return ck, cv
            if first + S <= slots:
                return ck[:, first : first + S], cv[:, first : first + S]
            idx = torch.remainder(torch.arange(first, first + S, device=ck.device), slots)
            return ck[:, idx], cv[:, idx]
        if not sliding:
            ck[:, start:end] = k
            cv[:, start:end] = v
            return ck[:, :end], cv[:, :end]
        R = self.ring
        n_old = min(start, R)  # ring slots written before this chunk
        keys = torch.cat([ck[:, :n_old], k], dim=1)  # [Hkv, n_old + T, hd]
        values = torch.cat([cv[:, :n_old], v], dim=1)
        keep = min(T, R)
        slots = meta.positions[-keep:] % R
        ck[:, slots] = k[:, -keep:]
        cv[:, slots] = v[:, -keep:]
        return keys, values


INITIAL_CAPACITY = 1024  # full-layer positions per slot a growable pool starts with


@dataclass
class SavedChunk:
    """A computed prompt chunk's cache contents, copied out of a slot (engine/prefix_cache.py):
    the full layers' K/V of its positions start..end-1 and every ring as it stood after it."""

    start: int
    end: int
    full: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> K, V [Hkv, end - start, hd]
    rings: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> K, V [Hkv, R, hd]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for kv in (*self.full.values(), *self.rings.values()) for t in kv)


class KVCachePool:
    """`num_seqs` sequence caches in one allocation (module docstring): buffers
    `[num_seqs, Hkv, slots, hd]`; `seqs[i]` is slot i's `KVCache`. Slots are handed out and
    taken back by the engine's scheduler; the pool only holds the memory. Full layers start
    at `INITIAL_CAPACITY` positions per slot and grow (`reserve`), unless `scratch_slot`
    (fixed-shape steps keep addresses) or `grow=False`."""

    def __init__(
        self,
        spec: ArchSpec,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
        num_seqs: int = 1,
        spare_ring_slots: int = 0,
        scratch_slot: bool = False,
        grow: bool = True,
    ):
        assert num_seqs >= 1, num_seqs
        self.spec, self.max_model_len, self.num_seqs, self.device = spec, max_model_len, num_seqs, device
        self.growable = grow and not scratch_slot
        self.capacity = min(max_model_len, INITIAL_CAPACITY) if self.growable else max_model_len
        self.generation = 0  # reallocations so far
        self.seqs = [
            KVCache(spec, max_model_len, dtype, device, spare_ring_slots, scratch_slot, buffers=({}, {}), index=s,
                    capacity=self.capacity)
            for s in range(num_seqs)
        ]
        shapes = self.seqs[0].buffer_shapes()
        self.k = {i: torch.zeros((num_seqs, *shape), dtype=dtype, device=device) for i, shape in shapes.items()}
        self.v = {i: torch.zeros((num_seqs, *shape), dtype=dtype, device=device) for i, shape in shapes.items()}
        self._bind()

    def _bind(self) -> None:
        for s, seq in enumerate(self.seqs):
            seq.pool, seq.capacity = self, self.capacity
            seq.k.update({i: t[s] for i, t in self.k.items()})
            seq.v.update({i: t[s] for i, t in self.v.items()})

    def reserve(self, positions: int) -> None:
        """Full layers hold at least `positions` per slot: the capacity doubles (up to
        max_model_len) until they do, the buffers reallocated with their contents."""
        if positions <= self.capacity:
            return
        assert self.growable and positions <= self.max_model_len, (positions, self.capacity, self.max_model_len)
        capacity = self.capacity
        while capacity < positions:
            capacity = min(2 * capacity, self.max_model_len)
        for buffers in (self.k, self.v):
            for i, old in buffers.items():
                if self.spec.layers[i].is_sliding:
                    continue  # a ring: its size never depends on the capacity
                new = torch.zeros((old.shape[0], old.shape[1], capacity, old.shape[3]), dtype=old.dtype, device=old.device)
                new[:, :, : old.shape[2]] = old
                buffers[i] = new
        self.capacity, self.generation = capacity, self.generation + 1
        self._bind()

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.k.values(), *self.v.values()])

    def bytes_at(self, capacity: int) -> int:
        """The pool's bytes with `capacity` full-layer positions per slot."""
        total = 0
        for buffers in (self.k, self.v):
            for i, t in buffers.items():
                slots = t.shape[2] if self.spec.layers[i].is_sliding else capacity
                total += t[:, :, :1].numel() * slots * t.element_size()
        return total

    def copy(self, src: int, dst: int, positions: int | None = None) -> None:
        """Slot dst's K/V := slot src's (a forked sequence: the same bits as recomputing them);
        with `positions`, only what a sequence at that length reads: full layers' positions
        0..positions-1 and the whole rings."""
        for buffers in (self.k, self.v):
            for i, t in buffers.items():
                if positions is None or self.spec.layers[i].is_sliding:
                    t[dst].copy_(t[src])
                else:
                    t[dst, :, :positions].copy_(t[src, :, :positions])

    def save_chunk(self, slot: int, start: int, end: int) -> SavedChunk:
        """A copy of what slot `slot` holds for a prompt chunk just computed at positions
        start..end-1 (its full-layer positions, the rings after it)."""
        full, rings = {}, {}
        for i in self.k:
            if self.spec.layers[i].is_sliding:
                rings[i] = (self.k[i][slot].clone(), self.v[i][slot].clone())
            else:
                full[i] = (self.k[i][slot, :, start:end].clone(), self.v[i][slot, :, start:end].clone())
        return SavedChunk(start, end, full, rings)

    def load_prefix(self, slot: int, chunks: list[SavedChunk]) -> None:
        """Slot `slot` := the cache of a sequence that has computed these consecutive chunks
        from position 0: each chunk's full-layer positions, the last one's rings."""
        assert chunks and chunks[0].start == 0 and all(a.end == b.start for a, b in zip(chunks, chunks[1:]))
        self.reserve(chunks[-1].end)
        for chunk in chunks:
            for i, (k, v) in chunk.full.items():
                self.k[i][slot, :, chunk.start : chunk.end].copy_(k)
                self.v[i][slot, :, chunk.start : chunk.end].copy_(v)
        for i, (k, v) in chunks[-1].rings.items():
            self.k[i][slot].copy_(k)
            self.v[i][slot].copy_(v)


def decode_metadata(rows: list[tuple[KVCache, int]]) -> AttentionMetadata:
    """A decode-like forward over rows of any sequences: (its cache, its position) per row.
    Each row is written at its own slot, then attends alone over its own sequence's visible
    keys, so every row is bit for bit its sequence's one-token step (the module docstring's
    ring argument, per sequence: rows of one sequence must be consecutive positions)."""
    first = rows[0][0]
    per_seq: dict[int, int] = {}  # rows of each sequence (by its cache)
    for cache, position in rows:
        per_seq[id(cache)] = n = per_seq.get(id(cache), 0) + 1
        if n > cache.max_decode_like_tokens:
            raise ValueError(f"{n} decode-like tokens of one sequence need {n - 1} spare ring slots; "
                             f"the cache has {cache.ring - cache.window}")
        cache.reserve(position + 1)
    positions = [p for _, p in rows]
    q = torch.tensor(positions, device=first.device)
    layer_types = {layer.layer_type for layer in first.spec.layers}
    return AttentionMetadata(-1, -1, q, dict.fromkeys(layer_types), decode_like=True,
                             row_caches=[c for c, _ in rows], row_positions=positions)
