"""kernels/huge_pages.py: copies in huge pages hold the same numbers, laid out in order."""

from __future__ import annotations

import pytest
import torch

from fastgemma.kernels import huge_pages


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(1536, 640, generator=g).to(torch.bfloat16),
        torch.randint(-127, 128, (640, 1024), generator=g, dtype=torch.int8),
        torch.randn(7, generator=g),  # odd sizes: the next one still starts on a cache line
        torch.randn(3, 5, generator=g).double(),
    ]


def test_pack_keeps_values_dtypes_and_shapes():
    tensors = _tensors()
    packed = huge_pages.pack(tensors)
    assert len(packed) == len(tensors)
    for t, p in zip(tensors, packed):
        assert p.dtype == t.dtype and p.shape == t.shape and p.is_contiguous() and torch.equal(p, t)


@pytest.mark.skipif(not huge_pages.available(), reason="transparent huge pages unavailable on this machine")
def test_pack_lays_tensors_out_in_order_in_one_aligned_mapping():
    tensors = _tensors()
    tensors[1][0, 0] = 1
    packed = huge_pages.pack(tensors)
    ptrs = [p.data_ptr() for p in packed]
    assert ptrs[0] % huge_pages.HUGE_PAGE == 0
    assert all(p % 64 == 0 for p in ptrs) and ptrs == sorted(ptrs)
    assert all(b - a >= t.numel() * t.element_size() for a, b, t in zip(ptrs, ptrs[1:], tensors))
    packed[1][0, 0] = 5  # a copy: the input is untouched
    assert tensors[1][0, 0] == 1


def test_non_cpu_or_empty_inputs_come_back_as_they_are():
    assert huge_pages.pack([]) == []
    meta = torch.empty(4, device="meta")
    assert huge_pages.pack([meta])[0] is meta
