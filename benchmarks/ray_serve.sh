#!/usr/bin/env bash
# sglang bench_serving (0.5.2) against `fastgemma serve` and `fastgemma serve --ray` with 1 and
# 2 replicas: output tok/s, median TTFT, median / p99 ITL at each concurrency.
#
#   BENCH_SERVING="SGLANG_VENV/bin/python -m sglang.bench_serving" TOKENIZER=<tokenizer folder> \
#     benchmarks/ray_serve.sh [serve options...]
#
# CONFIGS: the servers, in order (serve | ray1 | ray2; default "serve ray1 ray2 serve": the
# plain server again at the end shows the machine's drift). CONCURRENCIES (default "1 8 16"):
# 8 prompts at concurrency 1, 32 above. STREAM=0: non-streaming requests (the challenge
# harness's mode). Each server runs alone, is measured, then stopped with SIGTERM.
set -euo pipefail
PORT=${PORT:-8123}
OUTPUT_LEN=${OUTPUT_LEN:-128}
CONFIGS=${CONFIGS:-serve ray1 ray2 serve}
CONCURRENCIES=${CONCURRENCIES:-1 8 16}
STREAM=${STREAM:-1}
PROMPTS=${PROMPTS:-$(python -c "from fastgemma.data import challenge_file, PROMPTS_FILE; print(challenge_file(PROMPTS_FILE))")}
: "${BENCH_SERVING:?set BENCH_SERVING to the bench_serving command, e.g. SGLANG_VENV/bin/python -m sglang.bench_serving}"
: "${TOKENIZER:?set TOKENIZER to a folder holding the served model tokenizer.json}"
STREAM_FLAG=$([ "$STREAM" = 0 ] && echo --disable-stream || true)

run_bench() {  # concurrency, prompts
  $BENCH_SERVING --backend vllm-chat --base-url "http://127.0.0.1:$PORT" --model "$NAME" --tokenizer "$TOKENIZER" \
    --dataset-name sharegpt --dataset-path "$PROMPTS" --num-prompts "$2" --sharegpt-output-len "$OUTPUT_LEN" \
    --max-concurrency "$1" --request-rate inf --warmup-requests 2 --seed 1 $STREAM_FLAG \
    --extra-request-body '{"ignore_eos": true}' > bench.log 2>&1
  python - "$LABEL" "$1" <<'PY'
import re, sys
text = open("bench.log").read()
get = lambda key: float(re.search(re.escape(key) + r":\s+([\d.]+)", text).group(1))
print(f"{sys.argv[1]:<16} c={sys.argv[2]:<3} output tok/s {get('Output token throughput (tok/s)'):8.2f}   "
      f"TTFT median {get('Median TTFT (ms)'):7.1f} ms   ITL median {get('Median ITL (ms)'):6.1f} ms   "
      f"p99 {get('P99 ITL (ms)'):7.1f} ms", flush=True)
PY
}

measure() {  # label, serve arguments...
  LABEL=$1; shift
  setsid fastgemma serve --port "$PORT" "$@" > serve.log 2>&1 < /dev/null &
  SERVER=$!
  for _ in $(seq 1 300); do curl -sf "localhost:$PORT/v1/models" > models.json && break; sleep 1; done
  NAME=$(python -c "import json; print(json.load(open('models.json'))['data'][0]['id'])")
  for c in $CONCURRENCIES; do run_bench "$c" "$([ "$c" = 1 ] && echo 8 || echo 32)"; done
  kill -TERM "$SERVER"; wait "$SERVER" || true
}

for config in $CONFIGS; do
  case $config in
    serve) measure "serve" "$@" ;;
    ray1) measure "ray, 1 replica" --ray --replicas 1 "$@" ;;
    ray2) measure "ray, 2 replicas" --ray --replicas 2 "$@" ;;
    *) echo "unknown config $config (serve | ray1 | ray2)" >&2; exit 2 ;;
  esac
done
