"""The static KV cache's in-place description of a step (models/kv_cache.py): each query's
mask over a whole buffer marks exactly the slots holding the positions it may see."""

from __future__ import annotations

import torch

from fastgemma.models.kv_cache import KVCache
from fastgemma.models.spec import FULL, SLIDING, arch_spec_from_config
from tests import tiny_models


def _cache(spare: int) -> KVCache:
    spec = arch_spec_from_config(tiny_models.gemma4_e4b_like_config())  # window 8, both layer types
    return KVCache(spec, 64, torch.float32, torch.device("cpu"), spare_ring_slots=spare, scratch_slot=True)


def test_masks_mark_exactly_the_visible_positions_slots():
    for spare in (0, 3):
        cache = _cache(spare)
        W, R, L = cache.window, cache.ring, cache.max_model_len
        for start in range(0, 40):
            n = min(spare + 1, L - start)
            positions = torch.arange(start, start + n)
            # ring contents after writing 0..start+n-1 in order: slot s holds its latest position
            held = torch.full((R,), -1)
            for p in range(start + n):
                held[p % R] = p
            meta = cache.in_place_metadata(positions, positions, positions % R)
            for t, q in enumerate(positions.tolist()):
                ring = cache.in_place_mask(meta, SLIDING)[t]
                assert not ring[R]  # the scratch slot
                seen = {int(held[s]) for s in range(R) if ring[s]}
                assert seen == set(range(max(0, q - W + 1), q + 1)), (spare, start, q)
                full = cache.in_place_mask(meta, FULL)[t]
                assert full[: q + 1].all() and not full[q + 1 :].any()


def test_padding_rows_are_invalid_and_write_the_scratch_slot():
    cache = _cache(3)
    positions = torch.tensor([10, 11, 11, 11])
    full_slots = torch.tensor([10, 11, cache.max_model_len, cache.max_model_len])
    ring_slots = torch.tensor([10 % cache.ring, 11 % cache.ring, cache.ring, cache.ring])
    meta = cache.in_place_metadata(positions, full_slots, ring_slots)
    assert meta.valid.tolist() == [True, True, False, False]
    k = torch.randn(2, 4, 32)
    full_layer = next(i for i in cache.k if cache.spec.layers[i].layer_type == FULL)
    before = cache.k[full_layer].clone()
    cache.scatter(full_layer, k, k, meta)
    changed = (cache.k[full_layer] != before).any(dim=-1).any(dim=0).nonzero().flatten().tolist()
    assert changed == [10, 11, cache.max_model_len]


def test_a_pools_slots_are_views_of_one_allocation_and_copy_whole():
    """KVCachePool: slot i's cache is row i of every buffer; writing one slot leaves the others
    alone; `copy` makes one slot's K/V another's (a forked sequence)."""
    from fastgemma.models.kv_cache import KVCachePool

    spec = arch_spec_from_config(tiny_models.gemma4_e4b_like_config())
    pool = KVCachePool(spec, 32, torch.float32, torch.device("cpu"), num_seqs=3, spare_ring_slots=2)
    assert [c.index for c in pool.seqs] == [0, 1, 2] and all(c.pool is pool for c in pool.seqs)
    layer = next(iter(pool.k))
    hkv, hd = pool.k[layer].shape[1], pool.k[layer].shape[3]
    pool.seqs[1].write_row(layer, torch.ones(hkv, hd), torch.full((hkv, hd), 2.0), position=5)
    assert pool.seqs[1].k[layer].data_ptr() == pool.k[layer][1].data_ptr()
    assert pool.k[layer][1].sum() == hkv * hd and pool.k[layer][0].abs().sum() == pool.k[layer][2].abs().sum() == 0
    pool.copy(1, 2)
    assert all(torch.equal(t[1], t[2]) for t in (*pool.k.values(), *pool.v.values()))
    assert pool.num_bytes == 3 * sum(t[0].numel() * 4 for t in (*pool.k.values(), *pool.v.values()))
