"""What a multimodal checkpoint costs a text-only request per decode step.

Builds one small random Gemma 4 `Gemma4ForConditionalGeneration` (vision + audio towers)
and a copy of the same folder whose config drops the towers (the same text decoder,
tensor for tensor), loads both, and times greedy decoding of the same token-id prompt on
each, alternating run by run and swapping which goes first every repetition (with a fixed
order, whichever ran first measured ~3% slower on a 2-core machine, for either model). Timed: from the first generated token to the last (decode
steps only, prefill excluded), `ignore_eos`. Reports the median and spread per model, the
median of the per-pair ratios, a table for people and one JSON line for scripts.

    python benchmarks/multimodal_text_cost.py [--tokens 256] [--repetitions 5] [--hidden 256] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def build(folder: Path, hidden: int) -> tuple[Path, Path]:
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

    sliding, full = "sliding_attention", "full_attention"
    text = Gemma4TextConfig(
        vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=64, global_head_dim=128,
        num_global_key_value_heads=1, hidden_size_per_layer_input=16, sliding_window=512, num_kv_shared_layers=2,
        layer_types=[sliding, sliding, full, sliding, sliding, full], final_logit_softcapping=30.0,
        max_position_embeddings=4096,
    )
    vision = Gemma4VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=32, position_embedding_size=256)
    audio = Gemma4AudioConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                              subsampling_conv_channels=[128, 8], output_proj_dims=96)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=vision, audio_config=audio))
    mm = folder / "multimodal"
    model.save_pretrained(mm)
    text_only = folder / "text-only"
    text_only.mkdir()
    for f in mm.iterdir():
        (text_only / f.name).symlink_to(f)
    (text_only / "config.json").unlink()
    config = json.loads((mm / "config.json").read_text())
    config["vision_config"] = config["audio_config"] = None
    (text_only / "config.json").write_text(json.dumps(config))
    return mm, text_only


def decode_rate(llm, ids: list[int], tokens: int) -> float:
    from fastgemma import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    stamps = [time.perf_counter() for _ in llm.stream_ids(ids, params)]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    args = ap.parse_args()
    from fastgemma import LLM

    with tempfile.TemporaryDirectory() as tmp:
        mm, text_only = build(Path(tmp), args.hidden)
        kw = dict(dtype=args.dtype, max_model_len=1024, threads=args.threads)
        llms = {"multimodal": LLM(str(mm), **kw), "text-only": LLM(str(text_only), **kw)}
        assert llms["multimodal"].runner.towers is not None and llms["text-only"].runner.towers is None
        ids = [2] + [1000 + 7 * i for i in range(63)]
        for llm in llms.values():
            decode_rate(llm, ids, 16)  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in llms}
        names = list(llms)
        for r in range(args.repetitions):
            for name in names if r % 2 == 0 else names[::-1]:  # which runs first alternates
                rates[name].append(decode_rate(llms[name], ids, args.tokens))
    rows = {n: (statistics.median(r), statistics.stdev(r) if len(r) > 1 else 0.0) for n, r in rates.items()}
    # each multimodal run against the text-only run right after it: robust to slow drifts in load
    ratio = statistics.median(a / b for a, b in zip(rates["multimodal"], rates["text-only"]))
    print(f"text-only request, {args.tokens} greedy tokens, {args.repetitions} runs each, alternating")
    print("| checkpoint | decode tok/s (median ± sd) |\n| --- | --- |")
    for name, (med, sd) in rows.items():
        print(f"| {name} | {med:.1f} ± {sd:.1f} |")
    print(f"multimodal / text-only, median of per-pair ratios: {ratio:.3f}")
    print(json.dumps({"tokens": args.tokens, "repetitions": args.repetitions, "hidden": args.hidden,
                      "rates": rates, "ratio": ratio}))


if __name__ == "__main__":
    main()
