"""The Triton kernels compile for NVIDIA GPUs (sm_86: the challenge's A10G; sm_90: H100 / H200)
with Triton's own compiler and ptxas, ahead of time — no GPU needed. Catches what the
interpreter (tests/kernels/test_cuda_*.py) cannot: types, layouts, unsupported constructs.

The compiler runs in a child process: this test session runs Triton in interpreter mode
without a GPU (tests/conftest.py), which changes how `triton.language` behaves."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

COMPILE_ALL = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fastgemma.kernels import cuda_attention as ca, cuda_quant as cq

def build(fn, signature, constexprs, arch):
    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", arch, 32))

for arch in (86, 90):
    for sliding in (True, False):
        for hd, dt in ((256, "bf16"), (512, "bf16"), (256, "fp32")):
            p = "*" + dt
            build(ca._split_kernel, dict(
                q_ptr=p, k_ptr=p, v_ptr=p, pos_ptr="*i64", valid_ptr="*i1", m_ptr="*fp32", l_ptr="*fp32",
                acc_ptr="*fp32", T="i32", NUM_SPLITS="i32", GROUP="i32", SLOTS="i32", RING="i32", WINDOW="i32",
                scaling="fp32"), dict(SLIDING=sliding, HD=hd, SPLIT=ca.SPLIT, BLOCK=ca.BLOCK), arch)
            build(ca._fold_kernel, dict(m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", o_ptr=p, T="i32"),
                  dict(NUM_SPLITS=3, HD=hd), arch)
            print(f"attention sm_{arch} sliding={sliding} hd={hd} {dt}: ok", flush=True)
    for bits, group in ((8, 2560), (4, 32), (4, 128)):
        for dt in ("bf16", "fp32"):
            build(cq._quant_matmul_kernel, dict(
                x_ptr="*" + dt, q_ptr="*i8" if bits == 8 else "*u8", s_ptr="*fp32", part_ptr="*fp32",
                M="i32", N="i32", K="i32", NUM_GROUPS="i32"),
                dict(BLOCKS=8, BITS=bits, GROUP=group, IEEE=dt == "fp32", BLOCK_M=cq.BLOCK_M, BLOCK_N=cq.BLOCK_N), arch)
            print(f"quant sm_{arch} int{bits} group={group} {dt}: ok", flush=True)
'''


def test_every_kernel_variant_compiles_for_sm86_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, stated (silences its warning)
    proc = subprocess.run([sys.executable, "-c", COMPILE_ALL], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * (2 * 3 + 3 * 2) and all(line.endswith(": ok") for line in lines)
