"""The fixed-shape decode step: every decode and verification as one computation, on CUDA a CUDA graph.

Owns the static input buffers of decode-like steps and, on CUDA, the one graph that runs
them. Knows nothing of sampling or drafting: rows in, each row's hidden state, logits and
argmax out.

Every decode-like step (a decode: 1 token; a speculative verification: K + 1 tokens) runs
the same computation over `STATIC_ROWS` rows: the real tokens first, then padding rows (copies
of the last real token, whose K/V go to the cache's scratch slot, models/kv_cache.py). The
shapes never change, so

- one CUDA graph serves every step: captured at the first step, replayed after (the host
  writes ids, positions and slots into the input buffers, one copy, and reads the argmaxes
  back, one sync). Capture first runs the step twice eagerly on the real inputs; a step is
  idempotent (it rewrites the same K/V to the same slots), so those runs change nothing;
- a row's numbers do not depend on where it sits or on the other rows: every op is a GEMM
  (rows share no reduction; quantised ones: kernels/cuda_quant.py, one binary for any row
  count), a row-wise norm, elementwise, or attention computed row by row over the row's own
  context (kernels/cuda_attention.py; without Triton, masked attention over the whole
  buffers), and each kernel is chosen by the shapes alone, which are the same every step.
  Row i of a verification is therefore bit for bit the decode step of its token at its
  position, which is what keeps greedy speculative decoding token-identical to plain
  decoding here (engine/speculative.py). Plain decoding on this path pays for the padding
  rows in compute, not in bytes: the weights are read once per step either way, and padding
  rows skip attention.

`enforce_eager` runs the same computation without a graph (the plain path the graph is
checked against; also what runs on CPU in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastgemma.kernels.linear import NATIVE_MAX_ROWS
from fastgemma.models.gemma import GemmaForCausalLM
from fastgemma.models.kv_cache import KVCache

STATIC_ROWS = NATIVE_MAX_ROWS  # rows of every step: a verification holds at most K + 1 = 16 tokens


@dataclass
class StepOutput:
    hidden: torch.Tensor  # [n, D] final normed hidden rows (a copy)
    tokens: list[int]  # [n] argmax of each row's logits (lowest id on ties)
    logits: torch.Tensor | None  # [n, V] (a copy), when asked for


class StaticStep:
    def __init__(self, model: GemmaForCausalLM, cache: KVCache, use_graph: bool):
        assert cache.scratch_slot, "a static step needs a cache with a scratch slot"
        self.model, self.cache = model, cache
        device = cache.device
        self.use_graph = use_graph and device.type == "cuda"
        # rows: ids, positions, full-buffer slots, ring slots; [4, STATIC_ROWS] int64
        self.inputs = torch.zeros(4, STATIC_ROWS, dtype=torch.long, device=device)
        self.staging = torch.zeros(4, STATIC_ROWS, dtype=torch.long, pin_memory=device.type == "cuda")
        # A PLE table in host memory (models/gemma.py): the step's rows, gathered at staging
        self.ple_staging = self.ple_input = None
        if (table := model.ple_host) is not None:
            self.ple_staging = torch.empty(STATIC_ROWS, table.shape[1], dtype=table.dtype, pin_memory=device.type == "cuda")
            self.ple_input = torch.empty(STATIC_ROWS, table.shape[1], dtype=table.dtype, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # hidden, logits, argmax

    def compute(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step on `self.inputs`: hidden [R, D], logits [R, V], argmax [R]."""
        ids, positions, full_slots, ring_slots = self.inputs
        meta = self.cache.in_place_metadata(positions, full_slots, ring_slots)
        embeds, ple_ids = self.model.embed(ids)
        hidden = self.model(embeds, ple_ids, meta, self.cache, ple_rows=self.ple_input)  # [R, D]
        logits = self.model.compute_logits(hidden)  # [R, V]
        return hidden, logits, torch.argmax(logits, dim=-1)

    def stage(self, ids: list[int], start: int) -> None:
        """Fill the input buffers for ids at positions start.. (padding after them)."""
        n = len(ids)
        assert 1 <= n <= STATIC_ROWS, f"a step holds 1..{STATIC_ROWS} tokens, got {n}"
        if start + n > self.cache.max_model_len:
            raise ValueError(f"sequence of {start + n} tokens exceeds max_model_len={self.cache.max_model_len}")
        if n > self.cache.max_decode_like_tokens:  # the ring argument of models/kv_cache.py
            raise ValueError(f"{n} tokens in one step need {n - 1} spare ring slots; the cache has "
                             f"{self.cache.ring - self.cache.window}")
        c = self.cache
        positions = list(range(start, start + n))
        pad = STATIC_ROWS - n
        self.staging.copy_(torch.tensor([
            ids + [ids[-1]] * pad,
            positions + [positions[-1]] * pad,
            positions + [c.max_model_len] * pad,  # scratch: one past the full buffer
            [p % c.ring for p in positions] + [c.ring] * pad,  # scratch: one past the ring
        ]))
        self.inputs.copy_(self.staging, non_blocking=True)
        if self.ple_staging is not None:
            torch.index_select(self.model.ple_host, 0, self.staging[0], out=self.ple_staging)
            self.ple_input.copy_(self.ple_staging, non_blocking=True)

    def run(self, ids: list[int], start: int, want_logits: bool = False) -> StepOutput:
        n = len(ids)
        self.stage(ids, start)
        if not self.use_graph:
            hidden, logits, tokens = self.compute()
        else:
            if self.graph is None:
                self._capture()
            assert self.graph is not None and self.outputs is not None
            self.graph.replay()
            hidden, logits, tokens = self.outputs
        return StepOutput(
            hidden=hidden[:n].clone(),
            tokens=tokens[:n].tolist(),  # the one host sync of a step
            logits=logits[:n].clone() if want_logits else None,
        )

    def _capture(self) -> None:
        """Warm up on a side stream (lazy tables, allocator), then record the step."""
        stream = torch.cuda.Stream(device=self.cache.device)
        stream.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.compute()
        torch.cuda.current_stream(self.cache.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.outputs = self.compute()
        except RuntimeError as e:
            raise RuntimeError(
                f"capturing the decode step as a CUDA graph failed ({e}); "
                "run with --enforce-eager (LLM(enforce_eager=True)) to decode without the graph"
            ) from e
        self.graph = graph
