"""Measure this machine's memory read bandwidth (GB/s), the roofline for batch-1 decode.

Reads a buffer several times larger than the last-level cache and reports the median of
repeated full passes: on CPU with fastgemma's native library, its streaming-read kernel
(the access pattern and threads of the decode GEMVs); otherwise `torch.sum`.
"""

from __future__ import annotations

import statistics
import time

import torch

from fastgemma.kernels import native


def read_bandwidth_gb_s(size_mib: int = 1024, repetitions: int = 7, device: str = "cpu") -> float:
    numel = size_mib * 1024 * 1024 // 4
    buf = torch.ones(numel, dtype=torch.float32, device=device)  # touched: real pages, not the zero page
    sync = torch.cuda.synchronize if buf.is_cuda else (lambda: None)
    lib = native.load() if not buf.is_cuda else None
    read = (lambda: lib.stream_read_f32(buf.data_ptr(), numel)) if lib is not None else buf.sum
    read()
    sync()
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        read()
        sync()
        times.append(time.perf_counter() - t0)
    return numel * 4 / statistics.median(times) / 1e9
