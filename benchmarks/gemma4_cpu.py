"""The real Gemma 4 shapes on a CPU: an E2B-shaped random-weight decoder, bf16 / int8 / int4.

    python benchmarks/gemma4_cpu.py [--shape e2b] [--folder DIR] [--output-len 32]

Builds (once, into --folder) a Gemma 4 text decoder with random weights in bf16 (norm weights
near 1, `layer_scalar` in [0.5, 1.5], as benchmarks/gpu_e4b.py) of the E2B shape — our
reading of its config: D 1536, 35 layers as 7 x (4 sliding + 1 full), 8 heads, 1 KV head,
head dim 256 (512 on full layers), per-layer inputs of 256, the last 20 layers KV-shared
with double-wide MLPs, vocabulary 262144 — the embedded model's tokenizer beside it (the same vocabulary), then runs `fastgemma
bench decode` on it with the
body as stored (bf16), int8 and int4-g128 side by side (2 threads here). Prints the bench's
table and, per engine: decode tok/s, the bytes a step reads (cost model) and the fraction
of the measured read bandwidth, the load seconds, and the resident memory its load added
(with the peak) against the bytes of its weights as held.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

SLIDING, FULL = "sliding_attention", "full_attention"
SHAPES = {
    "e2b": dict(vocab=262144, D=1536, I=6144, blocks=7, sliding=4, heads=8, hd=256, P=256, window=512, shared=20),
    "tiny": dict(vocab=262144, D=128, I=256, blocks=2, sliding=4, heads=4, hd=32, P=16, window=32, shared=4),
}


def config(shape: str):
    from transformers import Gemma4TextConfig

    s = SHAPES[shape]
    layers = ([SLIDING] * s["sliding"] + [FULL]) * s["blocks"]
    return Gemma4TextConfig(
        vocab_size=s["vocab"], vocab_size_per_layer_input=s["vocab"], hidden_size=s["D"], intermediate_size=s["I"],
        num_hidden_layers=len(layers), num_attention_heads=s["heads"], num_key_value_heads=1, head_dim=s["hd"],
        global_head_dim=2 * s["hd"], num_global_key_value_heads=1, hidden_size_per_layer_input=s["P"],
        sliding_window=s["window"], num_kv_shared_layers=s["shared"], layer_types=layers, use_double_wide_mlp=True,
        final_logit_softcapping=30.0, max_position_embeddings=32768, rms_norm_eps=1e-6,
    )


def build(shape: str, folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(shape), dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.3) if "norm" in name else p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    import shutil

    from fastgemma.weights.checkpoint import gguf_meta_folder
    from fastgemma.weights.source import embedded_model_path

    for name in ("tokenizer.json", "tokenizer_config.json"):  # Gemma's vocabulary: text prompts work
        shutil.copy(gguf_meta_folder(embedded_model_path()) / name, folder / name)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="e2b")
    ap.add_argument("--folder", type=Path, default=None)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=2)
    a = ap.parse_args()
    folder = build(a.shape, a.folder or Path(tempfile.gettempdir()) / f"fastgemma-gemma4-{a.shape}")
    from fastgemma.bench.decode import DecodeBenchConfig, render_table, run_decode_bench

    cfg = DecodeBenchConfig(
        engines=DecodeBenchConfig.engine_grid({"model": str(folder), "max_model_len": 4096, "max_num_seqs": 1},
                                              quantization=("none", "int8", "int4-g128")),
        num_prompts=a.num_prompts, output_len=a.output_len, compare=(), warmup=1, check_identity=False,
    )
    result = run_decode_bench(cfg, log=lambda m: print(m, file=sys.stderr))
    render_table(result)
    from fastgemma import LLM

    for name, s in result["engines"].items():
        scheme = s["quantization"]
        llm = LLM(str(folder), max_model_len=4096, max_num_seqs=1, quantization=scheme)
        m = llm.model
        held = sum(t.numel() * t.element_size() for t in {id(t): t for t in [*m.parameters(), *m.buffers()]}.values())
        held += m.ple_host.numel() * m.ple_host.element_size() if m.ple_host is not None else 0
        s["weights_gib"] = held / 2**30
        s["screen_gib"] = (m.lm_head_screen.nbytes() if m.lm_head_screen is not None else 0) / 2**30
        del llm, m
        print(f"{name}: {s['decode_tok_s']:.2f} tok/s, step reads {s['bytes_per_token'] / 2**30:.2f} GiB "
              f"({100 * s['bandwidth_fraction']:.0f}% of {result['read_bandwidth_gb_s']:.1f} GB/s), load "
              f"{s['load_s']:.1f} s, +{s['resident_mib'] / 1024:.2f} GiB resident (peak {s['peak_mib'] / 1024:.2f}) "
              f"for {s['weights_gib']:.2f} GiB of weights as held (of which the mapped embedding and PLE tables "
              f"are read as touched) + {s['screen_gib']:.2f} GiB screen")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
