"""Prompt (prefill) throughput of the engine, and optionally its perplexity, in-process.

    python benchmarks/prefill.py [--num-prompts 16] [--rounds 3] [--ppl-records N]

Embedded Gemma 3 270M, bf16, defaults. Each of the challenge's first `num-prompts` prompts,
chat-templated, is prefilled alone (`LLM.generate`, max_tokens=1), `rounds` times in turn;
reported: the prompts' lengths, each round's prompt tokens per second, and their median. With
--ppl-records N the PPL over the first N challenge PPL records (scored by prefill; not timed).
For a before / after, run it with PYTHONPATH pointing at another commit's `src`. The last line
is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ppl-records", type=int, default=0)
    args = ap.parse_args()

    import fastgemma
    from fastgemma import LLM, SamplingParams
    from fastgemma.bench.decode import load_sharegpt_prompts
    from fastgemma.bench.ppl import load_ppl_records, perplexity
    from fastgemma.data import PPL_FILE, PROMPTS_FILE, challenge_file

    llm = LLM(dtype="bfloat16")
    prompts = load_sharegpt_prompts(challenge_file(PROMPTS_FILE), args.num_prompts)
    ids = [llm.chat_prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([ids[0]], params)  # warm-up
    rates = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for i in ids:
            llm.generate([i], params)
        rates.append(sum(map(len, ids)) / (time.perf_counter() - t0))
    result = {"code": str(fastgemma.__file__), "prompt_tokens": [len(i) for i in ids], "tok_s": rates,
              "tok_s_median": statistics.median(rates)}
    print(f"{len(ids)} prompts, {sum(map(len, ids))} tokens ({min(map(len, ids))}-{max(map(len, ids))} each)")
    print("prefill tok/s by round: " + ", ".join(f"{r:.0f}" for r in rates) + f"; median {result['tok_s_median']:.0f}")
    if args.ppl_records:
        ppl, n = perplexity(llm, load_ppl_records(challenge_file(PPL_FILE), args.ppl_records))
        result.update(ppl=ppl, ppl_tokens=n)
        print(f"PPL over {args.ppl_records} records ({n} tokens): {ppl:.5f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
