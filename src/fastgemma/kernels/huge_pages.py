"""Weights in 2 MB pages, so that streaming them every decode step does not miss the TLB.

A batch-1 decode step reads every weight once; in 4 KB pages that is one TLB miss per 4 KB
(65 000 page walks a step for Gemma 3 270M), which costs several percent of the step here.
`huge_pages(t)` returns a copy of a CPU tensor in an anonymous mapping advised
MADV_HUGEPAGE (transparent huge pages in "madvise" or "always" mode) and aligned to 2 MB; the
mapping lives as long as the tensor. `pack(tensors)` copies many (a decoder's layers, most
smaller than a page) one after another into one such mapping, in the order given — the
order a decode step reads them. Where that is not available (not Linux, THP off, non-CPU
tensors) both return their input: the numbers are the same either way.
"""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def available() -> bool:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in _THP.read_text()
    except OSError:
        return False


_ALIGN = 64  # each tensor starts on a cache line


def _arena(nbytes: int) -> torch.Tensor:
    """uint8 [nbytes] in huge pages, 2 MB aligned; the mapping lives as long as the tensor."""
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # whole pages, plus room to align
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: the pages are faulted in huge
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=size)  # keeps `buf` alive
    start = (-raw.data_ptr()) % HUGE_PAGE
    return raw[start : start + nbytes]


def pack(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` (contiguous, same dtypes and shapes) laid out in order in one
    huge-page mapping; the inputs themselves where huge pages are unavailable."""
    if not tensors or not available() or any(t.device.type != "cpu" for t in tensors):
        return tensors
    offsets, end = [], 0
    for t in tensors:
        offsets.append(end)
        end += -(-(t.numel() * t.element_size()) // _ALIGN) * _ALIGN
    arena = _arena(max(end, 1))
    out = []
    for t, o in zip(tensors, offsets):
        view = arena[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
    return out


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in huge pages (`torch.empty` where unavailable), to be
    filled in place: no second copy of a large tensor ever exists."""
    if not available():
        return torch.empty(shape, dtype=dtype)
    nbytes = max(1, torch.Size(shape).numel() * dtype.itemsize)
    return _arena(nbytes).view(dtype).view(shape)


def huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` backed by huge pages, or `t` itself (see `pack`)."""
    return pack([t])[0]
