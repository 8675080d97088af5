"""Step times while prompts are prefilled beside running streams (paced prompt stages), in-process.

    python benchmarks/prompt_stages.py [--budgets paced,528] [--rows 8] [--steps 400] [--every 40]

Embedded Gemma 3 270M, bf16, defaults otherwise, max_num_seqs 16. `rows` sequences decode;
every `every` steps the oldest is cancelled and a new chat request (a challenge prompt, ~150-440
tokens) takes its place, so one prompt at a time is prefilled beside `rows - 1` or `rows`
decoding streams. Each engine step is timed and classed by whether it ran prompt work.
Reported per budget (`paced`: max_num_batched_tokens unset, engine/scheduler.py
`paced_budget`; a number: that fixed budget, 528 = one whole 512-token chunk beside 16 rows):
median and p99 of decode-only steps, median / p90 / max of steps with prompt work, and the
time to first token of the new requests (median). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def measure(budget: int | None, rows: int, steps: int, every: int) -> dict:
    from fastgemma import LLM, SamplingParams
    from fastgemma.bench.decode import load_sharegpt_prompts
    from fastgemma.data import PROMPTS_FILE, challenge_file

    llm = LLM(dtype="bfloat16", max_num_seqs=16, max_num_batched_tokens=budget)
    texts = load_sharegpt_prompts(challenge_file(PROMPTS_FILE), 64)
    prompts = [llm.chat_prompt_ids([{"role": "user", "content": text}]) for text in texts]
    engine, params = llm.engine, SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True)
    running = [engine.add_request(p, params) for p in prompts[:rows]]
    while any(not s.output_token_ids for s in running):
        engine.step()
    decode, prompt, ttft, arrived, k = [], [], [], {}, rows
    for i in range(steps):
        if i % every == 0:
            engine.finish(running.pop(0), "abort")
            seq = engine.add_request(prompts[k % len(prompts)], params)
            running.append(seq)
            arrived[seq.seq_id], k = time.perf_counter(), k + 1
        queue = [*engine.scheduler.running, *engine.scheduler.waiting]
        busy = any(s.num_computed_tokens < s.num_prompt_tokens for s in queue)
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        (prompt if busy else decode).append(1e3 * (t1 - t0))
        for seq in running:
            if seq.seq_id in arrived and seq.output_token_ids:
                ttft.append(1e3 * (t1 - arrived.pop(seq.seq_id)))
    return {"budget": "paced" if budget is None else budget, "decode_ms_median": statistics.median(decode),
            "decode_ms_p99": _q(decode, 0.99), "prompt_steps": len(prompt),
            "prompt_ms_median": statistics.median(prompt), "prompt_ms_p90": _q(prompt, 0.9),
            "prompt_ms_max": max(prompt), "ttft_ms_median": statistics.median(ttft)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="paced,528")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=40)
    args = ap.parse_args()
    results = [measure(None if b == "paced" else int(b), args.rows, args.steps, args.every)
               for b in args.budgets.split(",")]
    print(f"{'budget':>7} {'decode ms med/p99':>18} {'prompt steps':>13} {'prompt-step ms med/p90/max':>27} "
          f"{'TTFT ms med':>12}")
    for r in results:
        print(f"{r['budget']!s:>7} {r['decode_ms_median']:>8.1f} / {r['decode_ms_p99']:<7.1f} {r['prompt_steps']:>13} "
              f"{r['prompt_ms_median']:>10.1f} / {r['prompt_ms_p90']:.1f} / {r['prompt_ms_max']:<6.1f} "
              f"{r['ttft_ms_median']:>12.0f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
