"""Prefix caching: requests that share a long document, with the cache and without, in-process.

    python benchmarks/prefix_cache.py [--doc-tokens 1600] [--requests 8] [--output-len 16]
    python benchmarks/prefix_cache.py --image [--requests 8] [--output-len 16]

Embedded Gemma 3 270M, bf16, defaults (prefill chunk 512). Each request's prompt is the same
document followed by its own question (a shared system prompt, a document asked about
several times, a conversation's earlier turns). The requests run one after another, each
alone, through `LLM.generate`: with prefix caching (the default) the first computes the whole
prompt and the others find the document's whole chunks kept; without (`enable_prefix_caching
=False`) every one computes everything. Reported: time to first token and wall time, median
over the requests after the first, and the prompt tokens computed; the greedy tokens are
asserted equal both ways. The last line is JSON.

`--image`: the shared start is an image and the conversation about it so far (a chat about
one picture, turn after turn: ~560 tokens, the image's 280 soft tokens first), on a
random-weight Gemma 4 with images built into a temporary folder: its vision tower of
transformers' default size (16 layers of 768), a decoder of the embedded model's widths
(D 640, 8 layers) with per-layer inputs, and the embedded tokenizer under Gemma 4's names
(tests/tiny_models.py). With the cache, a request whose kept chunks hold the whole image
runs no tower (engine/prefix_cache.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def measure(llm, prompts: list, output_len: int) -> dict:
    """`prompts`: token ids, or (token ids, multimodal inputs) pairs."""
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
            ids, media = prompt if isinstance(prompt, tuple) else (prompt, None)
            t0 = time.perf_counter()
            seq = engine.add_request(ids, params, media)
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


def build_image_model(folder: Path) -> Path:
    """The random Gemma 4 with images of `--image` (module docstring), saved to `folder`."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests/tiny_models.py
    from tests.tiny_models import randomize, write_gemma4_processor, write_gemma4_tokenizer

    sliding, full = "sliding_attention", "full_attention"
    text = Gemma4TextConfig(
        vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size=640, intermediate_size=2048,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=1, head_dim=256, global_head_dim=256,
        num_global_key_value_heads=1, hidden_size_per_layer_input=64, sliding_window=512, num_kv_shared_layers=2,
        layer_types=[sliding, sliding, sliding, full] * 2, final_logit_softcapping=30.0, max_position_embeddings=4096,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig()))
    randomize(model, 0)
    model.to(torch.bfloat16).save_pretrained(folder)
    write_gemma4_tokenizer(folder)
    write_gemma4_processor(folder, image_soft_tokens=280)
    return folder


def image_prompts(llm, requests: int) -> list[tuple]:
    """An image and the conversation about it so far, then each request's own question."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    pixels = (torch.rand(448, 448, 3, generator=g) * 255).to(torch.uint8).numpy()
    image = Image.fromarray(pixels)
    turns = " ".join(f"Turn {t}: you said the boat on the left is blue, and I asked about the sky {t} times."
                     for t in range(12))  # the conversation so far (~250 tokens)
    return [llm.encode_inputs({"prompt": f"<|image|> This is the harbour at sunrise. {turns} Question {q}: "
                                         f"what is in corner {q}?", "multi_modal_data": {"image": [image]}})
            for q in range(requests)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc-tokens", type=int, default=1600)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--image", action="store_true", help="the shared start is an image (module docstring)")
    args = ap.parse_args()

    from fastgemma import LLM

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_image_model(Path(tmp)) if args.image else None
        for name, caching in (("cache", True), ("no cache", False)):
            if args.image:
                llm = LLM(str(model), dtype="bfloat16", max_model_len=1024, enable_prefix_caching=caching)
                prompts = image_prompts(llm, args.requests)
            else:
                llm = LLM(dtype="bfloat16", enable_prefix_caching=caching)
                text = " ".join(f"Section {i}: the committee reviewed item {i * 7} and approved it." for i in range(400))
                doc = llm.encode_prompt(text)[: args.doc_tokens]
                prompts = [doc + llm.encode_prompt(f" Question {q}: what happened to item {q * 7}?",
                                                   add_special_tokens=False) for q in range(args.requests)]
            measure(llm, [[2, 100, 200, 300] * 200] * 2, 2)  # warm-up (another prompt)
            results[name] = measure(llm, prompts, args.output_len)
            del llm
    assert results["cache"].pop("tokens") == results["no cache"].pop("tokens"), "prefix caching changed tokens"
    shared = "an image + the conversation so far" if args.image else f"a {args.doc_tokens}-token document"
    print(f"# {args.requests} requests, one after another: {shared} + a question each, "
          f"{args.output_len} greedy tokens; the same tokens both ways")
    print(f"{'':>9} {'TTFT s first':>13} {'TTFT s rest':>12} {'wall s rest':>12} {'prompt tokens computed':>23}")
    for name, r in results.items():
        print(f"{name:>9} {r['ttft_s_first']:>13.3f} {r['ttft_s_median_rest']:>12.3f} {r['wall_s_median_rest']:>12.3f} "
              f"{r['prompt_tokens_computed']:>23}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
