"""Decode step time against the number of rows it carries (continuous batching), in-process.

    python benchmarks/batched_step.py [--rows 1,2,4,8,16] [--output-len 64] [--repetition-penalty R]

Embedded Gemma 3 270M, bf16, defaults (fused decode step, exact lm_head screen), max_num_seqs
16. For each row count R, R chat prompts decode `output-len` greedy tokens together with
`LLM.generate`; every engine step is timed, and so is the lm_head screen inside it. Reported:
the median step (decode steps only: every sequence advanced, the screen on all R rows in one
call or not at all), the screen's median (0 where it did not run), and R / step as tokens per
second (the engine's ceiling at that concurrency, without the server). With
--repetition-penalty the rows' logits are processed (penalised greedy rows read the screen's
sparse logits; before that, the full lm_head). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    args = ap.parse_args()

    from fastgemma import LLM, SamplingParams

    llm = LLM(dtype="bfloat16", max_num_seqs=16)
    engine, screen = llm.engine, llm.model.lm_head_screen
    steps: list[tuple[float, int, list[tuple[int, float]]]] = []  # (seconds, sequences advanced, screen calls)
    calls: list[tuple[int, float]] = []  # a step's screen calls: (rows, seconds)
    step, bounds = engine.step, screen.bounds

    def timed_step():
        calls.clear()
        t0 = time.perf_counter()
        out = step()
        steps.append((time.perf_counter() - t0, len(out), list(calls)))
        return out

    def timed_bounds(hidden, *args, **kwargs):
        t0 = time.perf_counter()
        out = bounds(hidden, *args, **kwargs)
        calls.append((hidden.shape[0], time.perf_counter() - t0))
        return out

    engine.step, screen.bounds = timed_step, timed_bounds
    topics = ["photosynthesis", "the history of Rome", "gravity", "how a compiler works", "tides", "volcanoes",
              "the printing press", "vaccines"]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                            repetition_penalty=args.repetition_penalty)
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        prompts = [llm.chat_prompt_ids([{"role": "user", "content": f"Explain {topics[i % 8]} ({i}) in detail."}])
                   for i in range(rows)]
        llm.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm-up
        steps.clear()
        llm.generate(prompts, params)
        # decode steps: every sequence advanced, and the screen (if it ran) took all R rows in one call
        decode = [(t, c[0][1] if c else 0.0) for t, n, c in steps
                  if n == rows and (not c or (len(c) == 1 and c[0][0] == rows))]
        step_ms = 1e3 * statistics.median(t for t, _ in decode)
        results.append({"rows": rows, "step_ms": step_ms, "screen_ms": 1e3 * statistics.median(s for _, s in decode),
                        "tok_s": rows / step_ms * 1e3})
    print(f"{'rows':>4} {'step ms':>8} {'screen ms':>10} {'tok/s':>7}")
    for r in results:
        print(f"{r['rows']:>4} {r['step_ms']:>8.1f} {r['screen_ms']:>10.1f} {r['tok_s']:>7.1f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
