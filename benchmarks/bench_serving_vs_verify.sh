#!/usr/bin/env bash
# sglang bench_serving (0.5.2) and `fastgemma verify --url` side by side on one `fastgemma serve`,
# the same prompts, seed and settings, alternating twice; prints both throughputs per run.
#
#   BENCH_SERVING="python -m sglang.bench_serving" benchmarks/bench_serving_vs_verify.sh [serve options...]
#
# BENCH_SERVING: how to run bench_serving (sglang installed in its own venv with --no-deps, see
# the README). TOKENIZER: a folder with the served model's tokenizer. PROMPTS: sharegpt JSON.
set -euo pipefail
PORT=${PORT:-8123}
NUM_PROMPTS=${NUM_PROMPTS:-8}
OUTPUT_LEN=${OUTPUT_LEN:-256}
PROMPTS=${PROMPTS:-$(python -c "from fastgemma.data import challenge_file, PROMPTS_FILE; print(challenge_file(PROMPTS_FILE))")}
: "${BENCH_SERVING:?set BENCH_SERVING to the bench_serving command, e.g. SGLANG_VENV/bin/python -m sglang.bench_serving}"
: "${TOKENIZER:?set TOKENIZER to a folder holding the served model tokenizer.json}"

fastgemma serve --port "$PORT" "$@" > serve.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 300); do curl -sf "localhost:$PORT/v1/models" > models.json && break; sleep 1; done
NAME=$(python -c "import json; print(json.load(open('models.json'))['data'][0]['id'])")

for run in 1 2; do
  $BENCH_SERVING --backend vllm-chat --base-url "http://127.0.0.1:$PORT" --model "$NAME" --tokenizer "$TOKENIZER" \
    --dataset-name sharegpt --dataset-path "$PROMPTS" --num-prompts "$NUM_PROMPTS" --sharegpt-output-len "$OUTPUT_LEN" \
    --max-concurrency 1 --request-rate inf --warmup-requests 4 --seed 1 --disable-stream \
    --extra-request-body '{"ignore_eos": true}' | grep -E "Benchmark duration|Total generated tokens:|Output token throughput"
  fastgemma verify --url "http://127.0.0.1:$PORT" --prompts "$PROMPTS" --num-prompts "$NUM_PROMPTS" \
    --num-private-prompts 1 --output-len "$OUTPUT_LEN" --warmup 4 --seed 1 --num-ppl-records 1 \
    --reference-ppl 5.5408 --out "verify-run$run" --json > "verify-run$run.log" 2>&1 || true
  python -c "import json; print('fastgemma verify tps', json.load(open('verify-run$run/summary.json'))['tps'])"
done
