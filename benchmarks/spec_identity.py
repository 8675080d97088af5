"""Greedy identity of speculative decoding against plain decoding, prompt by prompt.

    python benchmarks/spec_identity.py [--model M] [--dtype float32] [--num-prompts 128]
                                       [--max-tokens 512] [--speculative ngram] [-k 8] [--draft-model PATH]

For each challenge prompt (first human turn, chat template, in file order): greedy
`max_tokens` tokens with `ignore_eos` on a plain `LLM` and on a speculative one of the same
checkpoint and dtype; prints one line per prompt as it finishes (identical, or the first
divergent position) and a final JSON line with the counts and the acceptance. The same
check as `tests/engine/test_speculative_embedded.py` with FASTGEMMA_FULL_CHECKS=1, but it
reports progress, so a run cut short still says how many prompts it covered.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fastgemma import LLM, SamplingParams
from fastgemma.data import PROMPTS_FILE, challenge_file

DEFAULT_PROMPTS = challenge_file(PROMPTS_FILE)  # the packaged challenge prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--speculative", default="ngram")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    ap.add_argument("--draft-model", default=None)
    args = ap.parse_args()

    items = json.loads(args.prompts.read_text())[: args.num_prompts]
    texts = [next(t["value"] for t in item["conversations"] if t["from"] == "human") for item in items]
    max_len = 4096
    plain = LLM(args.model, dtype=args.dtype, max_model_len=max_len)
    spec = LLM(args.model, dtype=args.dtype, max_model_len=max_len, speculative=args.speculative,
               num_speculative_tokens=args.num_speculative_tokens, draft_model=args.draft_model)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    identical, divergent, start = 0, [], time.time()
    for i, text in enumerate(texts):
        ids = plain.chat_prompt_ids([{"role": "user", "content": text}])
        a = plain.generate([ids], params)[0].outputs[0].token_ids
        b = spec.generate([ids], params)[0].outputs[0].token_ids
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
        if first is None:
            identical += 1
        else:
            divergent.append({"prompt": i, "first_divergence": first})
        state = "identical" if first is None else f"DIVERGES at token {first}"
        print(f"prompt {i + 1}/{len(texts)} ({len(ids)} tokens): {state}  [{time.time() - start:.0f} s]", flush=True)
    print(json.dumps({
        "prompts": len(texts), "identical": identical, "divergent": divergent, "dtype": args.dtype,
        "max_tokens": args.max_tokens, "speculative": args.speculative, "k": args.num_speculative_tokens,
        "acceptance": spec.engine.spec_stats.as_dict(), "seconds": round(time.time() - start, 1),
    }))


if __name__ == "__main__":
    main()
