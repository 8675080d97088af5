"""The static KV cache's in-place description of a step (models/kv_cache.py): each query's
mask over a whole buffer marks exactly the slots holding the positions it may see."""

from __future__ import annotations

import pytest
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


def test_copy_of_a_prefix_takes_full_layers_positions_and_whole_rings():
    """`copy(src, dst, positions)`: a full layer's positions 0..positions-1 (not the rest),
    every ring slot (a ring's positions are mixed)."""
    from fastgemma.models.kv_cache import KVCachePool

    spec = arch_spec_from_config(tiny_models.gemma4_e4b_like_config())
    pool = KVCachePool(spec, 32, torch.float32, torch.device("cpu"), num_seqs=2)
    for buffers in (pool.k, pool.v):
        for t in buffers.values():
            t[0].normal_()
    pool.copy(0, 1, positions=5)
    full = [i for i in pool.k if not spec.layers[i].is_sliding]
    sliding = [i for i in pool.k if spec.layers[i].is_sliding]
    assert full and sliding
    for buffers in (pool.k, pool.v):
        for i in full:
            assert torch.equal(buffers[i][1, :, :5], buffers[i][0, :, :5]) and buffers[i][1, :, 5:].abs().sum() == 0
        for i in sliding:
            assert torch.equal(buffers[i][1], buffers[i][0])


def test_a_pool_grows_its_full_layers_and_keeps_their_contents(monkeypatch):
    """`reserve` doubles the full layers' positions per slot (up to max_model_len), copies what
    they held and re-binds every slot's views; rings keep their size."""
    from fastgemma.models import kv_cache

    monkeypatch.setattr(kv_cache, "INITIAL_CAPACITY", 4)
    spec = arch_spec_from_config(tiny_models.gemma4_e4b_like_config())
    pool = kv_cache.KVCachePool(spec, 20, torch.float32, torch.device("cpu"), num_seqs=2)
    full = next(i for i in pool.k if not spec.layers[i].is_sliding)
    ring = next(i for i in pool.k if spec.layers[i].is_sliding)
    ring_shape = tuple(pool.k[ring].shape)
    assert pool.capacity == 4 and pool.k[full].shape[2] == 4 and pool.num_bytes == pool.bytes_at(4)
    hkv, hd = pool.k[full].shape[1], pool.k[full].shape[3]
    pool.seqs[1].write_row(full, torch.full((hkv, hd), 3.0), torch.full((hkv, hd), 4.0), position=3)
    pool.seqs[1].metadata(3, 6)  # reaches position 8: 4 -> 8 -> 16
    assert pool.capacity == 16 and pool.generation == 1 and pool.seqs[0].capacity == 16
    assert tuple(pool.k[full].shape) == (2, hkv, 16, hd) and tuple(pool.k[ring].shape) == ring_shape
    assert pool.seqs[1].k[full].data_ptr() == pool.k[full][1].data_ptr()
    assert bool((pool.seqs[1].k[full][:, 3] == 3.0).all()) and bool((pool.seqs[1].v[full][:, 3] == 4.0).all())
    assert pool.seqs[0].k[full].abs().sum() == 0
    pool.seqs[0].metadata(19, 1)
    assert pool.capacity == 20  # capped at max_model_len
    with pytest.raises(ValueError, match="max_model_len=20"):
        pool.seqs[0].metadata(20, 1)
