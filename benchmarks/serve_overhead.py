"""Served throughput vs the engine's own, at concurrency 1 (what the server costs).

    python benchmarks/serve_overhead.py [--model PATH] [--prompts FILE] [--num-prompts 3] [--max-tokens 512]

Loads one `LLM`, then for the same ShareGPT prompts (first human turn, chat template) and
the same settings (greedy, `ignore_eos`, `max_tokens`):
- engine: `llm.generate` in-process, timed per request;
- served: the OpenAI server (`fastgemma.server.ServerThread`) on 127.0.0.1, one
  non-streaming `/v1/chat/completions` request at a time, timed per request by the client.
Prints a table and a final JSON line with both decode rates (tok/s) and served/engine.

Caveat: both paths share one process, so two OpenMP thread teams exist (the main thread's
and the server worker's) and libgomp stops spinning between parallel regions: both rates
come out ~40% below `fastgemma serve`'s own (see `load_on_passing_thread` in
server/serve.py). The ratio stays meaningful; for absolute served speed use
`fastgemma verify --url` or sglang's bench_serving against `fastgemma serve`
(benchmarks/bench_serving_vs_verify.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fastgemma.data import PROMPTS_FILE, challenge_file

DEFAULT_PROMPTS = challenge_file(PROMPTS_FILE)  # the packaged challenge prompts


def load_prompts(path: Path, n: int) -> list[str]:
    """First human turn of the first n items of a ShareGPT list ({"conversations": [{"from", "value"}]})."""
    items = json.loads(path.read_text())
    prompts = []
    for item in items:
        turns = item.get("conversations") or []
        human = next((t["value"] for t in turns if t.get("from") in ("human", "user") and t.get("value")), None)
        if human:
            prompts.append(human)
        if len(prompts) == n:
            break
    if not prompts:
        raise SystemExit(f"no human turns found in {path}")
    return prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder, .gguf or hub id (default: the embedded Gemma 3 270M)")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-model-len", type=int, default=None)
    args = ap.parse_args()

    import httpx

    from fastgemma import LLM, SamplingParams
    from fastgemma.server import ServerThread

    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len)
    print(f"loaded {llm.model_name} in {time.perf_counter() - t0:.1f} s (max_model_len {llm.max_model_len})", file=sys.stderr)

    prompts = []
    for text in load_prompts(args.prompts, args.num_prompts * 4):
        messages = [{"role": "user", "content": text}]
        if len(llm.chat_prompt_ids(messages)) + args.max_tokens <= llm.max_model_len:
            prompts.append(messages)
        if len(prompts) == args.num_prompts:
            break
    if not prompts:
        raise SystemExit("no prompt fits max_model_len with --max-tokens; lower --max-tokens")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    # Warm-up (first-call allocations, kernels) for both paths.
    llm.generate([llm.chat_prompt_ids(prompts[0])], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))

    # Engine and server alternate prompt by prompt, so drifting machine load hits both alike.
    rows = []
    with ServerThread(llm, max_queue=4) as server, httpx.Client(base_url=server.url, timeout=3600) as client:
        body = {"model": server.state.served_model_name, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True, "stream": False}
        client.post("/v1/chat/completions", json={**body, "messages": prompts[0]}).raise_for_status()
        for i, messages in enumerate(prompts):
            ids = llm.chat_prompt_ids(messages)
            start = time.perf_counter()
            out = llm.generate([ids], params)[0]  # the server's worker is idle meanwhile
            row = {"prompt": i, "prompt_tokens": len(ids), "engine_tokens": len(out.token_ids), "engine_s": time.perf_counter() - start}
            start = time.perf_counter()
            r = client.post("/v1/chat/completions", json={**body, "max_tokens": args.max_tokens, "messages": messages})
            row["served_s"] = time.perf_counter() - start
            r.raise_for_status()
            row["served_tokens"] = r.json()["usage"]["completion_tokens"]
            rows.append(row)

    print(f"{'prompt':>6} {'prompt_tok':>10} {'out_tok':>8} {'engine tok/s':>13} {'served tok/s':>13} {'ratio':>7}")
    for row in rows:
        e, s = row["engine_tokens"] / row["engine_s"], row["served_tokens"] / row["served_s"]
        print(f"{row['prompt']:>6} {row['prompt_tokens']:>10} {row['served_tokens']:>8} {e:>13.2f} {s:>13.2f} {s / e:>7.3f}")
    engine_tps = sum(r["engine_tokens"] for r in rows) / sum(r["engine_s"] for r in rows)
    served_tps = sum(r["served_tokens"] for r in rows) / sum(r["served_s"] for r in rows)
    print(f"{'all':>6} {'':>10} {'':>8} {engine_tps:>13.2f} {served_tps:>13.2f} {served_tps / engine_tps:>7.3f}")
    print(json.dumps({
        "model": llm.model_name,
        "num_prompts": len(rows),
        "max_tokens": args.max_tokens,
        "engine_tps": round(engine_tps, 3),
        "served_tps": round(served_tps, 3),
        "ratio": round(served_tps / engine_tps, 4),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
