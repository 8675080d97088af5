"""Offline batched throughput: fastgemma's engine vs transformers' continuous batching.

    python benchmarks/batching_peers.py [--concurrency 1,2,4,8] [--output-len 256] [--repeats 2]

At each concurrency C, C chat-formatted challenge prompts are submitted at once and every one
generates exactly `output-len` greedy tokens (EOS ignored): fastgemma `LLM.generate` (its
continuous batching, defaults: bf16, `max_num_seqs` 8 or C if larger) and transformers'
`generate_batch` (its continuous batching, paged attention with sdpa, bf16, on the same
embedded GGUF). Aggregate output tok/s = C x output-len / wall time (prefill included), the
median over `repeats`, the two engines alternating. One short untimed run each first.
Served figures (TTFT, inter-token latency, llama.cpp's llama-server) come from
`fastgemma bench serve`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from transformers import AutoModelForCausalLM
    from transformers.generation import GenerationConfig

    from fastgemma import LLM, SamplingParams
    from fastgemma.bench.decode import load_sharegpt_prompts
    from fastgemma.data import PROMPTS_FILE, challenge_file
    from fastgemma.weights.source import embedded_model_path

    ours = LLM(max_num_seqs=max(8, max(levels)))
    path = embedded_model_path()
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16,
                                                  attn_implementation="sdpa")
    texts = load_sharegpt_prompts(challenge_file(PROMPTS_FILE), max(levels))
    prompts = [ours.chat_prompt_ids([{"role": "user", "content": t}]) for t in texts]
    n = args.output_len
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=-1, pad_token_id=0)

    def run_ours(batch: list[list[int]]) -> int:
        return sum(len(o.token_ids) for o in ours.generate(batch, params))

    def run_theirs(batch: list[list[int]]) -> int:
        out = theirs.generate_batch(inputs=batch, generation_config=config, progress_bar=False)
        return sum(len(o.generated_tokens) for o in out.values())

    engines = {"fastgemma": run_ours, "transformers CB": run_theirs}
    for run in engines.values():  # warm-up
        run(prompts[:1])
    rows = []
    for c in levels:
        batch = prompts[:c]
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for r in range(args.repeats):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for name in order:
                start = time.perf_counter()
                tokens = engines[name](batch)
                rates[name].append(tokens / (time.perf_counter() - start))
        row = {"concurrency": c, **{name: round(statistics.median(v), 2) for name, v in rates.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'conc':>5} " + " ".join(f"{name:>16}" for name in engines) + "   (aggregate output tok/s)")
    for row in rows:
        print(f"{row['concurrency']:>5} " + " ".join(f"{row[name]:>16.2f}" for name in engines))
    print(json.dumps({"output_len": n, "repeats": args.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
