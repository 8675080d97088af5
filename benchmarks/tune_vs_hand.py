"""The tuner's winner against the best configuration documented by hand, measured alike.

Both configurations go through `fastgemma verify` (a fresh server each, the tuner's sample:
the same seeded public prompts as `fastgemma tune`, a held-out private split, PPL records,
greedy identity), alternating, `--rounds` times each. Prints one line per run, the medians,
the winner's share of the hand configuration's TPS, and one JSON line.

    python benchmarks/tune_vs_hand.py tune-out/preset.json --rounds 2

The hand configuration defaults to the README's best: int8 weights + n-gram speculation, k = 8.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fastgemma.preset import load_preset
from fastgemma.verify import ServeOptions, VerifyConfig, run_verify


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", type=Path, help="the tuner's preset.json")
    ap.add_argument("--hand", default='{"quantization": "int8", "speculative": "ngram", "num_speculative_tokens": 8}',
                    help="the hand configuration's options as JSON")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--num-ppl-records", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("tune-vs-hand"))
    args = ap.parse_args()

    preset = load_preset(args.preset)
    configs = {"tuned": ServeOptions(model=preset.model, **preset.options),
               "hand": ServeOptions(model=preset.model, **json.loads(args.hand))}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, serve in configs.items():
            s = run_verify(VerifyConfig(
                serve=serve, num_prompts=args.num_prompts, num_private_prompts=args.num_prompts,
                num_ppl_records=args.num_ppl_records, output_len=args.output_len, warmup=1,
                out=args.out / f"{name}-{r + 1}", progress=False,
            ), log=lambda _: None)
            runs[name].append(s)
            print(f"round {r + 1} {name:5s} {' '.join(serve.cli_args()):70s} public {s['tps']:7.2f}  "
                  f"private {s['private_tps']:7.2f} tok/s  PPL {s['ppl']:.4f}  {s['verdict']}", flush=True)
    med = {name: {"public_tps": statistics.median(x["tps"] for x in v),
                  "private_tps": statistics.median(x["private_tps"] for x in v),
                  "verdicts": [x["verdict"] for x in v], "serve_args": configs[name].cli_args()}
           for name, v in runs.items()}
    ratio = med["tuned"]["public_tps"] / med["hand"]["public_tps"]
    for name, m in med.items():
        print(f"median {name:5s} public {m['public_tps']:7.2f}  private {m['private_tps']:7.2f} tok/s  {m['verdicts']}")
    print(f"tuned / hand (public TPS, medians): {ratio:.3f}")
    print(json.dumps({"median": med, "tuned_over_hand": ratio}))


if __name__ == "__main__":
    main()
