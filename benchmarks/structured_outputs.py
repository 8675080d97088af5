"""Decode speed with a JSON-schema constraint vs without, at batch 1 and concurrency 8.

    python benchmarks/structured_outputs.py [--output-len 128] [--rounds 3] [--model M]

One engine (the defaults: bf16, lm_head screen), the challenge's first prompts as chat
turns, greedy. Unconstrained requests run with ignore_eos; constrained ones follow a schema
that cannot end before the token budget (an array of at least 64 records), so both produce
`--output-len` tokens. Rounds alternate the two modes; the figures are medians of the
aggregate decode tok/s (generated tokens / wall seconds of the batch, prefill excluded by
timing a 1-token run of the same batch first). Also printed: what building the grammar
engine's view of the vocabulary costs (time, resident memory), and the grammar's own cost
per token (mask computation, measured on the constrained outputs replayed through a matcher).
"""

from __future__ import annotations

import argparse
import statistics
import time

from fastgemma import LLM, SamplingParams, StructuredOutputsParams
from fastgemma.data import challenge_file
from fastgemma.memory import resident_bytes
from fastgemma.verify.data import load_prompts

SCHEMA = {
    "type": "array",
    "minItems": 64,
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}, "score": {"type": "integer"}},
        "required": ["name", "score"],
        "additionalProperties": False,
    },
}


def run(llm: LLM, ids: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    """(seconds, tokens generated) of one batch."""
    start = time.perf_counter()
    outs = llm.generate(ids, params)
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,8")
    args = ap.parse_args()
    llm = LLM(args.model, max_num_seqs=8, max_model_len=2048)
    prompts = [p.text for p in load_prompts(challenge_file("eval_prompts_sharegpt.json")) if len(p.text) < 600][:8]
    chats = [llm.chat_prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    constraint = StructuredOutputsParams(json=SCHEMA)
    modes = {
        "plain": dict(ignore_eos=True),
        "json schema": dict(structured_outputs=constraint),
    }
    before, start = resident_bytes(), time.perf_counter()
    llm.engine.grammars.tokenizer  # noqa: B018  (built on the first constrained request)
    print(f"grammar vocabulary (first constrained request): {time.perf_counter() - start:.1f} s, "
          f"{(resident_bytes() - before) / 2**20:.0f} MiB resident added")
    llm.generate(chats[:1], SamplingParams(max_tokens=4, temperature=0.0, structured_outputs=constraint))  # warm-up
    print(f"{'concurrency':>11} {'mode':>12} {'decode tok/s (median)':>22}  rounds")
    results = {}
    for c in [int(x) for x in args.concurrency.split(",")]:
        ids = chats[:c]
        for mode in modes:
            results[(c, mode)] = []
        for _ in range(args.rounds):
            for mode, extra in modes.items():
                prefill, _ = run(llm, ids, SamplingParams(max_tokens=1, temperature=0.0, **extra))
                seconds, tokens = run(llm, ids, SamplingParams(max_tokens=args.output_len, temperature=0.0, **extra))
                results[(c, mode)].append((tokens - len(ids)) / (seconds - prefill))
        for mode in modes:
            rates = results[(c, mode)]
            print(f"{c:>11} {mode:>12} {statistics.median(rates):>22.1f}  " + " ".join(f"{r:.1f}" for r in rates))
        slow = 1 - statistics.median(results[(c, "json schema")]) / statistics.median(results[(c, "plain")])
        print(f"{c:>11} {'overhead':>12} {100 * slow:>21.1f}%")
    # the grammar's own cost: masks for the constrained tokens, replayed
    out = llm.generate(chats[:1], SamplingParams(max_tokens=args.output_len, temperature=0.0,
                                                 structured_outputs=constraint))[0].outputs[0].token_ids
    grammar = llm.engine.grammars.compile(constraint)
    start = time.perf_counter()
    for t in out:
        grammar.bitmask()
        grammar.accept(t)
    per = (time.perf_counter() - start) / len(out)
    print(f"grammar mask + advance: {1e3 * per:.3f} ms per token ({len(out)} tokens)")


if __name__ == "__main__":
    main()
