"""Prefix caching: requests that share a long document, with the cache and without, in-process.

    python benchmarks/prefix_cache.py [--doc-tokens 1600] [--requests 8] [--output-len 16]

Embedded Gemma 3 270M, bf16, defaults (prefill chunk 512). Each request's prompt is the same
document followed by its own question (a shared system prompt, a document asked about
several times, a conversation's earlier turns). The requests run one after another, each
alone, through `LLM.generate`: with prefix caching (the default) the first computes the whole
prompt and the others find the document's whole chunks kept; without (`enable_prefix_caching
=False`) every one computes everything. Reported: time to first token and wall time, median
over the requests after the first, and the prompt tokens computed; the greedy tokens are
asserted equal both ways. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def measure(llm, prompts: list[list[int]], output_len: int) -> dict:
    from fastgemma import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    engine, runner = llm.engine, llm.runner
    computed, start = [], runner.start_prefill

    def counting(ids, at, *a, **k):
        computed.append(min(runner.prefill_chunk, len(ids) - at))
        return start(ids, at, *a, **k)

    runner.start_prefill = counting
    ttft, wall, tokens = [], [], []
    try:
        for prompt in prompts:
            t0 = time.perf_counter()
            seq = engine.add_request(prompt, params)
            while not seq.output_token_ids:
                engine.step()
            ttft.append(time.perf_counter() - t0)
            while engine.has_unfinished():
                engine.step()
            wall.append(time.perf_counter() - t0)
            tokens.append(seq.output_token_ids)
    finally:
        runner.start_prefill = start
    return {"ttft_s_first": ttft[0], "ttft_s_median_rest": statistics.median(ttft[1:]),
            "wall_s_median_rest": statistics.median(wall[1:]), "prompt_tokens_computed": sum(computed),
            "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=1600)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=16)
    args = ap.parse_args()

    from fastgemma import LLM

    results = {}
    for name, caching in (("cache", True), ("no cache", False)):
        llm = LLM(dtype="bfloat16", enable_prefix_caching=caching)
        text = " ".join(f"Section {i}: the committee reviewed item {i * 7} and approved it." for i in range(400))
        doc = llm.encode_prompt(text)[: args.doc_tokens]
        prompts = [doc + llm.encode_prompt(f" Question {q}: what happened to item {q * 7}?", add_special_tokens=False)
                   for q in range(args.requests)]
        measure(llm, [[2, 100, 200, 300] * 200] * 2, 2)  # warm-up (another prompt)
        results[name] = measure(llm, prompts, args.output_len)
        del llm
    assert results["cache"].pop("tokens") == results["no cache"].pop("tokens"), "prefix caching changed tokens"
    print(f"# {args.requests} requests, one after another: a {args.doc_tokens}-token document + a question each, "
          f"{args.output_len} greedy tokens; the same tokens both ways")
    print(f"{'':>9} {'TTFT s first':>13} {'TTFT s rest':>12} {'wall s rest':>12} {'prompt tokens computed':>23}")
    for name, r in results.items():
        print(f"{name:>9} {r['ttft_s_first']:>13.3f} {r['ttft_s_median_rest']:>12.3f} {r['wall_s_median_rest']:>12.3f} "
              f"{r['prompt_tokens_computed']:>23}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
