"""Build and load the C decode kernels (`cpu_*.c` beside this file) on first use.

The library is compiled once per source version with the system C compiler into
fastgemma's cache and loaded with ctypes. Where it cannot be used (no AVX-512 BF16 CPU, no
compiler, $FASTGEMMA_NATIVE=0) `load()` returns None and callers use torch's kernels;
`status()` says which and why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from fastgemma.config import cpu_flags
from fastgemma.paths import cache_dir

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_gemv.c", "cpu_attention.c", "cpu_norm.c", "cpu_decode_layer.c")]
FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"]
_REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc) found")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    cmd = [compiler, *FLAGS, "-o", str(tmp), *map(str, SOURCES), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    os.replace(tmp, target)


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("FASTGEMMA_NATIVE", "1") == "0":
        return None, "disabled by FASTGEMMA_NATIVE=0"
    missing = [f for f in _REQUIRED_CPU_FLAGS if f not in cpu_flags()]
    if missing:
        return None, f"CPU lacks {', '.join(missing)}"
    inputs = [*SOURCES, SOURCES[0].with_name("bf16.h")]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in inputs) + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"fastgemma_cpu-{digest}.so"
    try:
        if not target.is_file():
            _build(target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return None, f"build failed: {detail.strip().splitlines()[-1] if detail.strip() else e}"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.gemv_bf16.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_int]
    lib.gemv_f32.argtypes = [ptr, ptr, ptr, i64, i64]
    lib.stream_read_f32.argtypes = [ptr, i64]
    lib.stream_read_f32.restype = ctypes.c_float
    attn_args = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float, ptr]
    lib.attend_decode_bf16.argtypes = lib.attend_decode_f32.argtypes = attn_args
    lib.rms_norm_bf16.argtypes = lib.rms_norm_f32.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_float]
    lib.gemma_decode_layers_bf16.argtypes = [ptr, i64, ptr, ptr, ptr]
    for fn in (lib.gemma_decode_layers_bf16, lib.gemv_bf16, lib.gemv_f32, lib.attend_decode_bf16, lib.attend_decode_f32,
               lib.rms_norm_bf16, lib.rms_norm_f32):
        fn.restype = None
    return lib, f"native AVX-512 GEMV, decode attention, RMSNorm and fused bf16 decode step ({target.name})"


def load() -> ctypes.CDLL | None:
    return _load()[0]


def status() -> str:
    return _load()[1]
