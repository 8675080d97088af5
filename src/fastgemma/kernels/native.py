"""Build and load the C decode kernels (`cpu_*.c` beside this file) on first use.

The library is compiled once per source version and instruction set with the system C
compiler into fastgemma's cache and loaded with ctypes. Two builds: AVX-512 BF16 (bf16
products with `vdpbf16ps`) where the CPU has it, else AVX2 + FMA (bf16 widened to fp32
exactly). The AVX-512 build also needs AVX-512 VNNI (every CPU with AVX-512 BF16 has it) for
the lm_head screen's int8 activations (`screen_u8s8`, absent from the AVX2 build). Where
neither can be used (an older CPU, no compiler, $FASTGEMMA_NATIVE=0) `load()` returns None
and callers use torch's kernels; `status()` says which and why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from fastgemma.kernels.cpu import cpu_flags
from fastgemma.paths import cache_dir

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_gemv.c", "cpu_quant_gemv.c", "cpu_gguf_gemv.c", "cpu_attention.c", "cpu_norm.c", "cpu_screen.c", "cpu_decode_layer.c")]
_COMMON_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-mavx2", "-mfma", "-mf16c"]
# (name, compiler flags, /proc/cpuinfo flags it needs), best first
BUILDS = (
    ("avx512bf16", [*_COMMON_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mavx512vnni"],
     ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni")),
    ("avx2", _COMMON_FLAGS, ("avx2", "fma", "f16c")),
)


def isa() -> tuple[str, list[str]] | None:
    """The best build this CPU runs ($FASTGEMMA_ISA=avx2 forces the AVX2 one), or None."""
    flags = cpu_flags()
    forced = os.environ.get("FASTGEMMA_ISA")
    for name, cflags, needs in BUILDS:
        if forced and name != forced:
            continue
        if all(f in flags for f in needs):
            return name, cflags
    return None


def _build(target: Path, flags: list[str]) -> None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc) found")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    cmd = [compiler, *flags, "-o", str(tmp), *map(str, SOURCES), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    os.replace(tmp, target)


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("FASTGEMMA_NATIVE", "1") == "0":
        return None, "disabled by FASTGEMMA_NATIVE=0"
    chosen = isa()
    if chosen is None:
        return None, "CPU lacks AVX2 + FMA (or the $FASTGEMMA_ISA build)"
    name, flags = chosen
    inputs = [*SOURCES, *(SOURCES[0].with_name(h) for h in ("bf16.h", "simd.h", "vec.h"))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in inputs) + " ".join(flags).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"fastgemma_cpu-{name}-{digest}.so"
    try:
        if not target.is_file():
            _build(target, flags)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return None, f"build failed: {detail.strip().splitlines()[-1] if detail.strip() else e}"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    # GEMVs: (W, [scales,] x, y, M, N, K[, G], out_f32) for M input rows x [M, K]
    lib.gemv_bf16.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.gemv_f32.argtypes = [ptr, ptr, ptr, i64, i64, i64]
    lib.gemv_q8.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.gemv_q4.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
    # GGUF blocks: (type, W, x, y, M, N, K, ldy, out_f32); (type, W, out, N, K, out_f32)
    lib.gguf_gemv.argtypes = [ctypes.c_int, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
    lib.gguf_dequantize.argtypes = [ctypes.c_int, ptr, ptr, i64, i64, ctypes.c_int]
    lib.gguf_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.gguf_row_bytes.restype = i64
    lib.stream_read_f32.argtypes = [ptr, i64]
    lib.stream_read_f32.restype = ctypes.c_float
    attn_args = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ctypes.c_float, ptr]  # q k v o H Hkv S first slots hd
    lib.attend_decode_bf16.argtypes = lib.attend_decode_f32.argtypes = attn_args
    # rows: q q_stride k[] v[] o o_stride S[] first[] n H Hkv slots hd scaling scratch
    rows_args = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float, ptr]
    for fn in (getattr(lib, n, None) for n in ("attend_decode_bf16_rows", "attend_decode_f32_rows")):
        if fn is not None:  # (absent from an older commit's build, which benchmarks/batched_kernels.py loads)
            fn.argtypes, fn.restype = rows_args, None
    lib.rms_norm_bf16.argtypes = lib.rms_norm_f32.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_float]
    lib.gemma_decode_layers_bf16.argtypes = [ptr, i64, ptr, i64, ptr, ptr, ptr, ptr, ptr]
    lib.screen_select.argtypes = [ptr, ptr, ctypes.c_float, i64, ctypes.c_int, ptr, ptr, ptr, ptr]
    lib.screen_select.restype = i64
    if hasattr(lib, "screen_u8s8"):  # the AVX-512 build
        lib.screen_pack_q8.argtypes = [ptr, ptr, i64, i64, ptr, ptr, ptr]
        lib.screen_unpack_q8.argtypes = [ptr, i64, i64, ptr]
        lib.screen_u8s8.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int, ptr, ptr,
                                    ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.screen_pack_q8.restype = lib.screen_unpack_q8.restype = lib.screen_u8s8.restype = None
    lib.gelu_tanh_f32.argtypes = [ptr, ptr, i64]
    lib.gelu_tanh_f32.restype = None
    lib.set_gelu_table_bf16.argtypes = [ptr]
    lib.set_gelu_table_bf16.restype = None
    lib.gelu_mul_bf16.argtypes = [ptr, ptr, ptr, i64, i64]
    lib.gelu_mul_bf16.restype = None
    for fn in (lib.gemma_decode_layers_bf16, lib.gemv_bf16, lib.gemv_f32, lib.gemv_q8, lib.gemv_q4,
               lib.gguf_gemv, lib.gguf_dequantize,
               lib.attend_decode_bf16, lib.attend_decode_f32, lib.rms_norm_bf16, lib.rms_norm_f32):
        fn.restype = None
    return lib, f"native {name} GEMV (bf16, fp32, int8, int4, GGUF blocks), decode attention, RMSNorm and fused bf16 decode step ({target.name})"


def load() -> ctypes.CDLL | None:
    return _load()[0]


def status() -> str:
    return _load()[1]
