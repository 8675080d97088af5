"""Matrix-vector speed: fastgemma's native GEMV vs torch's `F.linear`, on Gemma 3 270M shapes.

    python benchmarks/gemv.py [--repetitions 30]

Times y = x @ W^T for one row x (batch-1 decode) per shape and dtype: median over
repetitions after warm-up, reported as ms and GB/s of weight read, beside the machine's read
bandwidth (the bench's streaming probe). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from fastgemma.bench.bandwidth import read_bandwidth_gb_s
from fastgemma.kernels import native
from fastgemma.kernels.cpu import physical_cores
from fastgemma.kernels.linear import linear

SHAPES = {"lm_head": (262144, 640), "qkv": (1536, 640), "gate_up": (4096, 640), "down": (640, 2048)}


def median_s(fn, repetitions: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(physical_cores())
    if native.load() is None:
        raise SystemExit(f"native kernels unavailable: {native.status()}")
    rows = []
    for name, (n, k) in SHAPES.items():
        for dtype in (torch.bfloat16, torch.float32):
            w, x = torch.randn(n, k).to(dtype), torch.randn(1, k).to(dtype)
            nbytes = w.numel() * w.element_size()
            t_native = median_s(lambda x=x, w=w: linear(x, w, use_native=True), args.repetitions)
            t_torch = median_s(lambda x=x, w=w: F.linear(x, w), args.repetitions)
            rows.append({
                "shape": name, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."),
                "native_ms": 1e3 * t_native, "native_gb_s": nbytes / t_native / 1e9,
                "torch_ms": 1e3 * t_torch, "torch_gb_s": nbytes / t_torch / 1e9,
            })
    bandwidth = read_bandwidth_gb_s()
    print(f"{'shape':>8} {'dtype':>9} {'native ms':>10} {'GB/s':>6} {'torch ms':>9} {'GB/s':>6}")
    for r in rows:
        print(f"{r['shape']:>8} {r['dtype']:>9} {r['native_ms']:>10.2f} {r['native_gb_s']:>6.1f} "
              f"{r['torch_ms']:>9.2f} {r['torch_gb_s']:>6.1f}")
    print(f"read bandwidth {bandwidth:.1f} GB/s (shapes other than lm_head fit in cache)")
    print(json.dumps({"rows": rows, "read_bandwidth_gb_s": bandwidth}))


if __name__ == "__main__":
    main()
