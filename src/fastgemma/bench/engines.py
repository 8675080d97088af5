"""The engines `fastgemma bench decode` times, behind one interface.

`run(ids, output_len)` generates exactly `output_len` tokens greedily (end-of-sequence
ignored) after the prompt `ids` and returns the token ids and two times:
- `ttft_s`: from the call until the first generated token exists (prefill + first sample);
- `decode_s`: from then until the last token exists (output_len - 1 decode steps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Timing:
    token_ids: list[int]
    ttft_s: float
    decode_s: float


class FastgemmaEngine:
    """fastgemma's engine loop on a loaded `LLM`; named "fastgemma", "fastgemma int8",
    "fastgemma ngram", "fastgemma int8 ngram", ... (scheme and speculative method)."""

    def __init__(self, llm):
        self.llm = llm
        parts = [p for p in (llm.quantization, llm.config.speculative) if p != "none"]
        self.name = " ".join(["fastgemma", *parts])

    def run(self, ids: list[int], output_len: int) -> Timing:
        from fastgemma import SamplingParams

        engine = self.llm.engine
        seq = engine.add_request(ids, SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True))
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        while not seq.is_finished:
            engine.step()
        t2 = time.perf_counter()
        return Timing(list(seq.output_token_ids), t1 - t0, t2 - t1)


class TransformersEngine:
    """transformers `generate` on the same weights, dtype and device (eager attention, greedy)."""

    name = "transformers"

    def __init__(self, source, dtype, device="cpu"):
        import torch
        from transformers import AutoModelForCausalLM

        kwargs = dict(dtype=dtype, attn_implementation="eager")
        if source.kind == "gguf":
            model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
        self.model, self.torch, self.device = model.eval().to(device), torch, device

    def _generate(self, ids: list[int], n: int) -> list[int]:
        with self.torch.inference_mode():
            out = self.model.generate(
                self.torch.tensor([ids], device=self.device), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=0,
            )
        return out[0, len(ids) :].tolist()  # a host copy: the GPU has finished

    def run(self, ids: list[int], output_len: int) -> Timing:
        t0 = time.perf_counter()
        self._generate(ids, 1)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens = self._generate(ids, output_len)
        total = time.perf_counter() - t0
        return Timing(tokens, ttft, max(total - ttft, 1e-9))


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python on the same GGUF (greedy: top_k = 1)."""

    name = "llama.cpp"

    def __init__(self, gguf: Path, n_ctx: int, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False)

    def run(self, ids: list[int], output_len: int) -> Timing:
        self.llm.reset()
        tokens: list[int] = []
        t0 = time.perf_counter()
        t1 = t0
        for tok in self.llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if not tokens:
                t1 = time.perf_counter()
            tokens.append(int(tok))
            if len(tokens) == output_len:
                break
        t2 = time.perf_counter()
        return Timing(tokens, t1 - t0, t2 - t1)
