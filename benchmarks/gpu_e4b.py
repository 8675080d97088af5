"""The GPU checks of the decode path, speculative verification and quantisation, in one run.

    python benchmarks/gpu_e4b.py [--out benchmarks/results/gpu-e4b-h200] [--budget-s 540]
    python benchmarks/gpu_e4b.py --shape tiny --device cpu     # a smoke run of this script

On an E4B-shaped Gemma 4 text decoder with random weights (transformers' Gemma4ForCausalLM
built from the E4B config, saved as a checkpoint), bf16, batch 1, one random prompt of
`--prompt-len` ids, `--output-len` greedy tokens (end-of-sequence ignored):

1. copy bandwidth: bytes moved (read + written, as STREAM counts a copy) per second by
   `dst.copy_(src)` over 1 GiB buffers, median of 9;
2. decode tok/s, median of `--repetitions` runs after one warm-up, timed from the first
   generated token to the last (prefill not included), of fastgemma with its CUDA graph (the
   default) and of the same engine with its step run eagerly (`--enforce-eager`'s path,
   switched on the loaded engine; its tokens must equal the graph's); the bytes a step reads
   (the cost model: weights + K/V at the mean context, prompt + half the output), the HBM
   bound = copy bandwidth / those bytes, and the graph's tok/s as a fraction of it;
3. transformers `generate` with `cache_implementation="static"` on the same weights, timed
   as in 2 (decode = generate(N) - generate(1));
4. n-gram speculation (K = 8): decode tok/s, mean acceptance length, tokens equal to plain;
   then on that engine the time of one step holding K + 1 tokens (a verification of K
   drafts), K = 0..8, median of 50 each: the figure that, with a drafter's acceptance rate,
   sets speculative decoding's speed-up;
5. quantised body linears (int4-g128, int8, int4-g32): decode tok/s through the CUDA graph,
   tokens equal to the same engine's eager step, bytes per step, fraction of the bound.

Each phase is skipped, with a note, once `--budget-s` seconds have passed; a phase that fails
records its error and the run goes on. Prints a table and, last, one JSON line; with
`--out DIR` also writes DIR/result.json and DIR/result.txt.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fastgemma import LLM, SamplingParams
from fastgemma.bench.cost_model import bytes_per_token

SLIDING, FULL = "sliding_attention", "full_attention"


# The E4B text config (architecture notes), and a tiny one of the same kind for smoke runs.
SHAPES = {
    "e4b": dict(vocab=262144, D=2560, I=10240, blocks=7, heads=8, hd=256, P=256, window=512, shared=18, max_len=131072),
    "tiny": dict(vocab=4096, D=128, I=256, blocks=2, heads=4, hd=32, P=16, window=32, shared=2, max_len=4096),
}


def e4b_config(shape: str):
    """Gemma4TextConfig for `shape`: blocks of 5 sliding layers + 1 full, 2 KV heads, global
    head dim twice the sliding one, the final softcap of 30."""
    from transformers import Gemma4TextConfig

    s = SHAPES[shape]
    return Gemma4TextConfig(
        vocab_size=s["vocab"], vocab_size_per_layer_input=s["vocab"], hidden_size=s["D"], intermediate_size=s["I"],
        num_hidden_layers=6 * s["blocks"], num_attention_heads=s["heads"], num_key_value_heads=2, head_dim=s["hd"],
        global_head_dim=2 * s["hd"], num_global_key_value_heads=2, hidden_size_per_layer_input=s["P"],
        sliding_window=s["window"], num_kv_shared_layers=s["shared"], layer_types=([SLIDING] * 5 + [FULL]) * s["blocks"],
        final_logit_softcapping=30.0, max_position_embeddings=s["max_len"], rms_norm_eps=1e-6,
    )


def build_checkpoint(shape: str, device: str, folder: Path):
    """Random weights (norm weights near 1, layer_scalar in [0.5, 1.5]) built on `device` in
    bf16, saved to `folder`; returns the transformers model (kept for its baseline)."""
    from transformers import AutoModelForCausalLM

    config = e4b_config(shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
            else:
                p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return model.eval()


def copy_bandwidth_gb_s(device: str, size_mib: int = 1024, repetitions: int = 9) -> float:
    src = torch.ones(size_mib * 1024 * 1024 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if src.is_cuda else (lambda: None)
    dst.copy_(src)
    sync()
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9  # read + written


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fastgemma_decode(llm: LLM, prompt: list[int], n: int, reps: int) -> tuple[float, list[int]]:
    """(median decode tok/s over reps after a warm-up, the tokens)."""
    engine, rates, tokens = llm.engine, [], []
    for i in range(reps + 1):
        seq = engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        engine.step()  # prefill + first token
        t0 = time.perf_counter()
        while not seq.is_finished:
            engine.step()
        dt = time.perf_counter() - t0  # each step ends in a host sync (its tokens)
        tokens = list(seq.output_token_ids)
        if i:
            rates.append((n - 1) / dt)
    return (statistics.median(rates) if rates else float("nan")), tokens


def transformers_decode(model, prompt: list[int], n: int, reps: int, device: str, cache: str) -> float:
    """Median decode tok/s of `generate` with `cache_implementation=cache` ("static", "dynamic")."""
    ids = torch.tensor([prompt], device=device)

    def generate(k: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                           cache_implementation=cache, pad_token_id=0)
        sync(device)
        return time.perf_counter() - t0

    rates = []
    for i in range(reps + 1):
        ttft, total = generate(1), generate(n)
        if i:
            rates.append((n - 1) / max(total - ttft, 1e-9))
    return statistics.median(rates)


def step_times_ms(llm: LLM, prompt: list[int], device: str, ks: range, replays: int = 50) -> dict[int, float]:
    """Median time of one decode-like step holding K + 1 tokens, per K."""
    runner = llm.runner
    runner.prefill(prompt)
    out = {}
    for k in ks:
        ids = [prompt[-1]] * (k + 1)
        runner.verify(ids, len(prompt), greedy=True)  # warm-up (and graph capture)
        times = []
        for _ in range(replays):
            sync(device)
            t0 = time.perf_counter()
            runner.verify(ids, len(prompt), greedy=True)
            times.append(time.perf_counter() - t0)
        out[k] = statistics.median(times) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=tuple(SHAPES), default="e4b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    start = time.perf_counter()
    dev = args.device
    result: dict[str, Any] = {"shape": args.shape, "device": dev, "torch": torch.__version__,
                              "prompt_len": args.prompt_len, "output_len": args.output_len,
                              "max_model_len": args.max_model_len, "phases": {}, "notes": []}
    if dev.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(0)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    def phase(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        elapsed = time.perf_counter() - start
        if elapsed > args.budget_s:
            result["notes"].append(f"{name}: skipped, {elapsed:.0f} s of the {args.budget_s:.0f} s budget used")
            say(f"[{name}] skipped (budget)")
            return
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # recorded: the other phases still run
            out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
            say(f"[{name}] FAILED: {type(e).__name__}: {e}")
        out["seconds"] = round(time.perf_counter() - t0, 1)
        result["phases"][name] = out
        gc.collect()
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()

    n, reps = args.output_len, args.repetitions
    context = args.prompt_len + n // 2  # the mean context of a decode step
    prompt = torch.randint(10, 4000, (args.prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    folder = Path(tempfile.mkdtemp(prefix="fastgemma-e4b-"))
    state: dict[str, Any] = {}

    def p_bandwidth() -> dict[str, Any]:
        bw = copy_bandwidth_gb_s(dev)
        state["bw"] = bw
        say(f"copy bandwidth: {bw:.0f} GB/s (read + written)")
        return {"copy_gb_s": bw}

    def p_build() -> dict[str, Any]:
        state["hf"] = build_checkpoint(args.shape, dev, folder)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        say(f"checkpoint: {size / 1e9:.1f} GB in {folder}")
        return {"checkpoint_gb": size / 1e9}

    def llm(**kw: Any) -> LLM:
        return LLM(str(folder), dtype="bfloat16", device=dev, max_model_len=args.max_model_len, **kw)

    def p_decode() -> dict[str, Any]:
        graph = llm()
        tps, tokens = fastgemma_decode(graph, prompt, n, reps)
        weights = bytes_per_token(graph.model, 0)
        step_bytes = bytes_per_token(graph.model, context)
        out = {"fastgemma_graph_tok_s": tps, "bytes_per_token": step_bytes, "weight_bytes": weights,
               "kv_bytes": step_bytes - weights, "cuda_graph": any(s.graph is not None for s in graph.runner.static.values())}
        state["tokens"] = tokens
        eager_tps, eager_tokens = eager_decode(graph, reps)
        del graph
        out.update(fastgemma_eager_tok_s=eager_tps, graph_tokens_equal_eager=eager_tokens == tokens)
        if "bw" in state:
            bound = state["bw"] * 1e9 / step_bytes
            out.update(hbm_bound_tok_s=bound, fraction_of_bound=tps / bound)
        say(f"fastgemma CUDA graph: {tps:.1f} tok/s; eager step: {eager_tps:.1f} tok/s; "
            f"tokens equal: {eager_tokens == tokens}")
        say(f"bytes per step: {step_bytes / 1e9:.2f} GB (weights {weights / 1e9:.2f}, K/V {(step_bytes - weights) / 1e9:.3f})"
            + (f"; HBM bound {out['hbm_bound_tok_s']:.0f} tok/s, fraction {out['fraction_of_bound']:.2f}"
               if "bw" in state else ""))
        return out

    def eager_decode(engine_llm: LLM, repetitions: int) -> tuple[float, list[int]]:
        """The loaded engine with its step run eagerly (what --enforce-eager runs)."""
        steps = list(engine_llm.runner.static.values())  # the fixed-shape steps, one per cache slot used
        if not steps:  # not CUDA: there is no graph to compare with
            return fastgemma_decode(engine_llm, prompt, n, repetitions)
        for step in steps:
            step.use_graph = False
        try:
            return fastgemma_decode(engine_llm, prompt, n, repetitions)
        finally:
            for step in steps:
                step.use_graph = True

    def p_transformers() -> dict[str, Any]:
        model = state.pop("hf")
        try:
            tps, cache = transformers_decode(model, prompt, n, reps, dev, "static"), "static"
        except Exception as e:  # a cache this model's generate does not support: say so, use the default
            result["notes"].append(f"transformers static cache failed ({type(e).__name__}: {e}); dynamic used")
            tps, cache = transformers_decode(model, prompt, n, reps, dev, "dynamic"), "dynamic"
        say(f"transformers generate ({cache} cache): {tps:.1f} tok/s")
        return {"transformers_tok_s": tps, "transformers_cache": cache}

    def p_ngram() -> dict[str, Any]:
        spec = llm(speculative="ngram", num_speculative_tokens=8, prompt_lookup_min=1)  # 8 spare ring slots
        tps, tokens = fastgemma_decode(spec, prompt, n, reps)
        stats = spec.engine.spec_stats.as_dict()
        same = tokens == state.get("tokens")
        say(f"ngram K=8: {tps:.1f} tok/s, mean acceptance length {stats['mean_acceptance_length']:.2f}, "
            f"tokens equal to plain: {same}")
        steps = step_times_ms(spec, prompt, dev, range(0, 9))
        for k, ms in steps.items():
            say(f"step with K={k} drafts ({k + 1} tokens): {ms:.3f} ms ({ms / steps[0]:.2f} x a 1-token step)")
        return {"ngram_tok_s": tps, "tokens_equal_plain": same, **stats, "step_ms_by_k": steps}

    def p_quant(scheme: str) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            graph = llm(quantization=scheme)
            tps, tokens = fastgemma_decode(graph, prompt, n, reps)
            step_bytes = bytes_per_token(graph.model, context)
            _, eager_tokens = eager_decode(graph, 0)
            del graph
            out = {"tok_s": tps, "bytes_per_token": step_bytes, "graph_tokens_equal_eager": tokens == eager_tokens}
            if "bw" in state:
                out["fraction_of_bound"] = tps * step_bytes / (state["bw"] * 1e9)
            say(f"{scheme}: {tps:.1f} tok/s, {step_bytes / 1e9:.2f} GB per step, "
                f"graph tokens equal eager: {tokens == eager_tokens}")
            return out
        return run

    phase("bandwidth", p_bandwidth)
    phase("build", p_build)
    if "build" in result["phases"] and "error" not in result["phases"]["build"]:
        phase("decode", p_decode)
        phase("transformers", p_transformers)
        phase("ngram", p_ngram)
        for scheme in ("int4-g128", "int8", "int4-g32"):
            phase(scheme, p_quant(scheme))
    result["total_s"] = round(time.perf_counter() - start, 1)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "result.txt").write_text("\n".join(lines) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
