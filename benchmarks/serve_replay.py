"""`fastgemma bench serve`'s traffic replayed in-process, with every engine step timed and classed.

    python benchmarks/serve_replay.py [--concurrency 1,8] [--rounds 2] [--output-len 256] [--num-prompts 16]

Embedded Gemma 3 270M, bf16, max_num_seqs 16, defaults otherwise (paced prompt stages). At each
concurrency C, C clients each send `rounds` chat requests (the challenge prompts, taken in
turn, as the served bench takes them) of `output-len` greedy tokens (EOS ignored), a client's
next request queued when its last one finishes; no HTTP, no tokenizer on the way. Reported
per level: wall time and output tok/s, then the steps grouped by how many rows decoded and
whether the step also ran prompt work (count, total seconds, median ms), and the time a
perfectly packed run would take: the prompt work (its steps' time beyond a decode-only step
of as many rows) plus every output token in full steps of min(C, rows) rows. The last line is
JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict


def replay(llm, ids: list[list[int]], concurrency: int, rounds: int, output_len: int) -> dict:
    from fastgemma import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    jobs = [ids[i % len(ids)] for i in range(concurrency * rounds)]
    live = [engine.add_request(jobs.pop(0), params) for _ in range(concurrency)]
    steps: list[tuple[int, bool, float]] = []  # (rows decoding, prompt work, seconds)
    start = time.perf_counter()
    while engine.has_unfinished():
        running = engine.scheduler.running
        rows = sum(s.num_computed_tokens >= s.num_prompt_tokens for s in running)
        prompt = bool(engine.scheduler.waiting) or any(s.num_computed_tokens < s.num_prompt_tokens for s in running)
        t0 = time.perf_counter()
        engine.step()
        steps.append((rows, prompt, time.perf_counter() - t0))
        for seq in [s for s in live if s.is_finished]:
            live.remove(seq)
            if jobs:
                live.append(engine.add_request(jobs.pop(0), params))
    wall = time.perf_counter() - start
    groups: dict[tuple[int, bool], list[float]] = defaultdict(list)
    for rows, prompt, dt in steps:
        groups[(rows, prompt)].append(dt)
    decode_ms = {r: statistics.median(v) for (r, p), v in groups.items() if not p and r}
    full = max((r for r in decode_ms), default=0)
    prompt_s = sum(dt - decode_ms.get(r, 0.0) for (r, p), v in groups.items() if p for dt in v)
    packed = prompt_s + concurrency * rounds * output_len / max(full, 1) * decode_ms.get(full, 0.0)
    return {
        "concurrency": concurrency, "wall_s": wall, "output_tok_s": concurrency * rounds * output_len / wall,
        "packed_s": packed,
        "steps": [{"rows": r, "prompt": p, "count": len(v), "total_s": sum(v), "median_ms": 1e3 * statistics.median(v)}
                  for (r, p), v in sorted(groups.items())],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=16)
    args = ap.parse_args()

    from fastgemma import LLM, SamplingParams
    from fastgemma.bench.decode import load_sharegpt_prompts
    from fastgemma.bench.serve import PROMPTS_FILE
    from fastgemma.data import challenge_file

    llm = LLM(dtype="bfloat16", max_num_seqs=16)
    prompts = load_sharegpt_prompts(challenge_file(PROMPTS_FILE), args.num_prompts)
    ids = [llm.chat_prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    llm.generate([ids[0]], SamplingParams(max_tokens=4))  # warm-up
    results = []
    for c in (int(x) for x in args.concurrency.split(",")):
        r = replay(llm, ids, c, args.rounds, args.output_len)
        results.append(r)
        print(f"concurrency {c}: {r['wall_s']:.2f} s, {r['output_tok_s']:.1f} tok/s "
              f"(x{r['output_tok_s'] / results[0]['output_tok_s']:.2f}); perfectly packed: {r['packed_s']:.2f} s")
        print("  rows  prompt  steps  total s  median ms")
        for g in r["steps"]:
            print(f"  {g['rows']:4d}  {'yes' if g['prompt'] else 'no':>6}  {g['count']:5d}  {g['total_s']:7.2f}  {g['median_ms']:9.1f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
