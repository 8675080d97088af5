"""The native kernels of a decode step against the rows it carries, for one or more builds side by side.

    python benchmarks/batched_kernels.py [KERNELS_DIR ...] [--rows 1,2,4,8,16] [--keys 100,400,800]

Each KERNELS_DIR is a `src/fastgemma/kernels` folder (this checkout's when none is given; a
git worktree of another commit for a before / after), built as fastgemma builds it and loaded
into this one process; the builds then take turns, 7 rounds, and the medians are reported:
- body: `gemv_bf16` over the bf16 matrices of the embedded Gemma 3 270M's 18 layers (random
  values of its shapes: qkv, o, gate | up, down), R input rows (ms);
- screen: the int8 lm_head screen (`LmHeadScreen.bounds`, 262144 x 640, random values), R rows (ms);
- attention: one `attend_decode_bf16` call (4 query heads, 1 kv head, head dim 256) over S keys (us);
- attention, 8 rows: the 8 rows of a batched step, each its own sequence's query over S keys of
  its own cache (us): one `attend_decode_bf16_rows` call where the build has it, else 8 calls.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--keys", default="100,400,800")
    args = ap.parse_args()

    import torch

    from fastgemma.kernels import lm_head_screen, native

    own = list(native.SOURCES)
    dirs = args.dirs or [own[0].parent]
    libs = []
    for d in dirs:
        native.SOURCES = [d / p.name for p in own]
        lib, status = native._load.__wrapped__()  # a build of that folder's sources (cached by their digest)
        if lib is None:
            raise SystemExit(f"{d}: {status}")
        libs.append(lib)
    native.SOURCES = own
    current = [libs[0]]
    native.load = lambda: current[0]  # the screen calls whichever build is current

    g = torch.Generator().manual_seed(0)
    D, I, hd = 640, 2048, 256
    shapes = [(4 * hd + 2 * hd, D), (D, 4 * hd), (2 * I, D), (D, I)]  # qkv, o, gate | up, down
    weights = [(torch.randn(n, k, generator=g) * 0.05).bfloat16() for _ in range(18) for n, k in shapes]
    screen = lm_head_screen.LmHeadScreen((torch.randn(262144, D, generator=g) * 0.05).bfloat16(), lambda x: x)
    rows = [int(r) for r in args.rows.split(",")]
    keys = [int(s) for s in args.keys.split(",")]
    xs = {r: {k: torch.randn(r, k, generator=g).bfloat16() for k in (D, 4 * hd, I)} for r in rows}
    hs = {r: (torch.randn(r, D, generator=g) * 3).bfloat16() for r in rows}
    y = torch.empty(16, 2 * I, dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(1, max(keys), hd, generator=g).bfloat16() for _ in range(2))
    q, o = torch.randn(4, hd, generator=g).bfloat16(), torch.empty(4, hd, dtype=torch.bfloat16)
    scratch = torch.empty(8 * 4 * (max(keys) + hd))
    R = 8
    kr, vr = (torch.randn(R, max(keys), hd, generator=g).bfloat16() for _ in range(2))
    qr, orows = torch.randn(R, 4, hd, generator=g).bfloat16(), torch.empty(R, 4, hd, dtype=torch.bfloat16)
    ptrs = {name: (ctypes.c_void_p * R)(*[b.data_ptr() + i * b.stride(0) * 2 for i in range(R)])
            for name, b in (("k", kr), ("v", vr))}
    zeros = (ctypes.c_int64 * R)()

    def body(lib, r):
        for w in weights:
            n, k = w.shape
            lib.gemv_bf16(w.data_ptr(), xs[r][k].data_ptr(), y.data_ptr(), r, n, k, 0)

    def attention(lib, s):
        lib.attend_decode_bf16(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), 4, 1, s, 0,
                               max(keys), hd, ctypes.c_float(hd**-0.5), scratch.data_ptr())

    def attention_rows(lib, s):
        S = (ctypes.c_int64 * R)(*[s] * R)
        if hasattr(lib, "attend_decode_bf16_rows"):
            lib.attend_decode_bf16_rows(qr.data_ptr(), 4 * hd, ptrs["k"], ptrs["v"], orows.data_ptr(), 4 * hd, S, zeros,
                                        R, 4, 1, max(keys), hd, ctypes.c_float(hd**-0.5), scratch.data_ptr())
        else:
            for i in range(R):
                lib.attend_decode_bf16(qr[i].data_ptr(), ptrs["k"][i], ptrs["v"][i], orows[i].data_ptr(), 4, 1, s, 0,
                                       max(keys), hd, ctypes.c_float(hd**-0.5), scratch.data_ptr())

    def timed(fn, repeats):
        fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats

    samples: dict[tuple, list[float]] = {}
    for _ in range(7):
        for i, lib in enumerate(libs):
            current[0] = lib
            for r in rows:
                samples.setdefault((i, "body", r), []).append(1e3 * timed(lambda lib=lib, r=r: body(lib, r), 3))
                samples.setdefault((i, "screen", r), []).append(
                    1e3 * timed(lambda r=r: screen.bounds(hs[r], with_err=False), 5))
            for s in keys:
                samples.setdefault((i, "attention", s), []).append(1e6 * timed(lambda lib=lib, s=s: attention(lib, s), 200))
                samples.setdefault((i, "attention8", s), []).append(
                    1e6 * timed(lambda lib=lib, s=s: attention_rows(lib, s), 50))
    med = {k: statistics.median(v) for k, v in samples.items()}
    names = [str(d) for d in dirs]
    for i, name in enumerate(names):
        print(f"== {name}")
        print("rows  body ms  screen ms")
        for r in rows:
            print(f"{r:4d} {med[(i, 'body', r)]:8.2f} {med[(i, 'screen', r)]:10.2f}")
        print("keys  attention us  8 rows us")
        for s in keys:
            print(f"{s:4d} {med[(i, 'attention', s)]:13.1f} {med[(i, 'attention8', s)]:10.1f}")
    print(json.dumps([{"kernels": name, "body_ms": {r: med[(i, "body", r)] for r in rows},
                       "screen_ms": {r: med[(i, "screen", r)] for r in rows},
                       "attention_us": {s: med[(i, "attention", s)] for s in keys},
                       "attention_8_rows_us": {s: med[(i, "attention8", s)] for s in keys}} for i, name in enumerate(names)]))


if __name__ == "__main__":
    main()
