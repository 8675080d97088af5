"""n choices of one prompt against n requests of the same prompt, in-process.

    python benchmarks/choices.py [--n 2,4,8] [--prompt-tokens 1000] [--output-len 32]

Embedded Gemma 3 270M, bf16, defaults (max_num_seqs 8), seeded sampling (temperature 0.8).
For each n: `LLM.generate(prompt, SamplingParams(n=n, ...))` (the prompt computed once, its
cache slot copied to the other choices) and `LLM.generate([prompt] * n, SamplingParams(n=1,
...))` with each request's seed set to the choice's (seed + i): the same tokens, asserted.
Reported: the wall time of each, the time until every choice has its first token, and the
prompt tokens the engine computed. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time


def measure(llm, prompt: list[int], n: int, output_len: int) -> dict:
    from fastgemma import SamplingParams

    params = SamplingParams(n=n, max_tokens=output_len, temperature=0.8, seed=1, ignore_eos=True)
    runner, engine = llm.runner, llm.engine
    computed: list[int] = []
    start = runner.start_prefill

    def counting(ids, at, *a, **k):
        computed.append(min(runner.prefill_chunk, len(ids) - at))
        return start(ids, at, *a, **k)

    runner.start_prefill = counting
    out = {"n": n}
    try:
        for name, groups in (("choices", [(prompt, params)]),
                             ("requests", [(prompt, params.for_choice(i)) for i in range(n)])):
            computed.clear()
            t0 = time.perf_counter()
            seqs = [s for ids, p in groups for s in engine.add_choices(ids, p)]
            first = None
            while engine.has_unfinished():
                engine.step()
                if first is None and all(s.output_token_ids for s in seqs):
                    first = time.perf_counter() - t0
            out[name] = {"wall_s": time.perf_counter() - t0, "all_first_tokens_s": first,
                         "prompt_tokens_computed": sum(computed)}
            out[name + "_tokens"] = [s.output_token_ids for s in seqs]
    finally:
        runner.start_prefill = start
    assert out.pop("choices_tokens") == out.pop("requests_tokens"), "choices differ from their requests"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=32)
    args = ap.parse_args()

    from fastgemma import LLM

    llm = LLM(dtype="bfloat16")
    text = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(200))
    prompt = llm.encode_prompt(text)[: args.prompt_tokens]
    measure(llm, prompt, 2, 4)  # warm-up
    results = [measure(llm, prompt, int(n), args.output_len) for n in args.n.split(",")]
    print(f"# prompt {len(prompt)} tokens, {args.output_len} sampled tokens a choice; the same tokens both ways")
    print(f"{'n':>3} {'':>9} {'wall s':>8} {'all first tokens s':>19} {'prompt tokens computed':>23}")
    for r in results:
        for name in ("choices", "requests"):
            m = r[name]
            print(f"{r['n']:>3} {name:>9} {m['wall_s']:>8.2f} {m['all_first_tokens_s']:>19.2f} "
                  f"{m['prompt_tokens_computed']:>23}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
