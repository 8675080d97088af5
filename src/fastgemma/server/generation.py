"""Engine-side work of one request, run on its job thread (worker.py): generate, score, format.

`run_generation` reads the text deltas of a request's prompts, each with its `n` choices, from
the engine loop (worker.py: the engine steps them and every other running request together;
stop strings and UTF-8-safe deltas are the LLM's `RequestStream`), checks for cancellation
between tokens and records the latency metrics (per choice: each is a stream of its own).
The formatters turn engine logprobs into the API's shapes; they decode token pieces on the
job threads (the tokenizer's other users: pre-processing, and the engine loop's incremental
detokenising; none of them changes the tokenizer's settings).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.models.towers import MultimodalInputs
from fastgemma.outputs import StreamDelta
from fastgemma.server.metrics import Metrics
from fastgemma.server.worker import Job

LOGPROB_FLOOR = -9999.0  # -inf is not JSON; vLLM clamps the same way


@dataclass
class Prepared:
    """One validated prompt, ready for the engine."""

    ids: list[int]
    params: SamplingParams
    max_tokens: int  # 0: no generation (completions with echo)
    prompt_text: str = ""  # for echo
    multimodal: MultimodalInputs | None = None  # tower inputs of a chat with images / audio


@dataclass
class GenResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None  # per generated token, when requested
    extra: dict[str, Any] = field(default_factory=dict)  # formatted logprobs etc.


OnToken = Callable[[int, StreamDelta, dict[int, float] | None], None]


def run_generation(
    job: Job, metrics: Metrics, prompts: list[Prepared], on_token: OnToken | None = None
) -> list[GenResult]:
    """Generate every prompt's `n` choices (the same n for all), together: the engine batches
    them. Results in the API's order, choice j of prompt i at i * n + j; `on_token(index,
    delta, logprobs)` after each token when streaming. A prompt with max_tokens 0 (echo
    only) gets its results without running."""
    job.check()
    n, want_lp = prompts[0].params.n, prompts[0].params.logprobs is not None
    results = [GenResult() for _ in range(len(prompts) * n)]
    live = []  # the prompts that generate: their index
    for i, p in enumerate(prompts):
        metrics.prompt_tokens.inc(len(p.ids))
        if p.max_tokens > 0:
            live.append(i)
            continue
        for r in results[i * n : (i + 1) * n]:
            r.finish_reason = "length"
            r.logprobs = [] if want_lp else None
    if not live:
        return results
    parts: list[list[str]] = [[] for _ in results]
    last: list[float | None] = [None] * len(results)
    seqs: list[Any] = [None] * len(results)
    gen = job.worker.engine.stream(job, [(prompts[i].ids, prompts[i].params, prompts[i].multimodal) for i in live])
    try:
        for k, delta, seq in gen:
            index = live[k // n] * n + k % n
            t, r, seqs[index] = time.perf_counter(), results[index], seq
            if last[index] is None:
                metrics.ttft.observe(t - job.arrival)
            else:
                metrics.itl.observe(t - last[index])
            last[index] = t
            if delta.token_id is not None:
                r.token_ids.append(delta.token_id)
            if delta.finish_reason:
                r.finish_reason = delta.finish_reason
            parts[index].append(delta.text)
            if on_token is not None:
                on_token(index, delta, seq.output_logprobs[-1] if want_lp and seq.output_logprobs else None)
            job.check()
    finally:
        gen.close()  # cancels the sequences in the engine when we stop early
        metrics.generation_tokens.inc(sum(len(r.token_ids) for r in results))
    for r, text, seq in zip(results, parts, seqs):
        if seq is not None:
            r.text = "".join(text)
            r.logprobs = list(seq.output_logprobs) if want_lp else None
    return results


def clamp(x: float) -> float:
    return LOGPROB_FLOOR if math.isnan(x) or x < LOGPROB_FLOOR else float(x)


class Formatter:
    """Logprob formatting with a cache of decoded token pieces."""

    def __init__(self, tokenizer: Any):
        self.piece = lru_cache(maxsize=1 << 16)(tokenizer.token_text)

    def prompt_logprobs(self, ids: list[int], entries: list[Any]) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's prompt_logprobs: None, then {id: {logprob, rank, decoded_token}} with the actual token first."""
        out: list[dict[str, dict[str, Any]] | None] = []
        for pos, entry in enumerate(entries):
            if entry is None:
                out.append(None)
                continue
            actual = ids[pos]
            d = {str(actual): {"logprob": clamp(entry.logprob), "rank": entry.rank, "decoded_token": self.piece(actual)}}
            for rank, (tid, lp) in enumerate(entry.top, start=1):
                key = str(tid)
                if key not in d:
                    d[key] = {"logprob": clamp(lp), "rank": rank, "decoded_token": self.piece(tid)}
            out.append(d)
        return out

    def completion_logprobs(
        self,
        token_ids: list[int],
        token_lps: list[dict[int, float] | None],
        start_offset: int = 0,
    ) -> dict[str, Any]:
        """OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset.

        `token_lps[i]` holds token i's own logprob and its top alternatives (None: no logprob,
        the first prompt token under echo).
        """
        tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
        offset = start_offset
        for tid, lps in zip(token_ids, token_lps):
            piece = self.piece(tid)
            tokens.append(piece)
            text_offset.append(offset)
            offset += len(piece)
            if lps is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(clamp(lps.get(tid, LOGPROB_FLOOR)))
            top: dict[str, float] = {}
            for alt, lp in sorted(lps.items(), key=lambda kv: -kv[1]):
                top.setdefault(self.piece(alt), clamp(lp))
            top_logprobs.append(top)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offset}

    def chat_logprobs(self, token_ids: list[int], token_lps: list[dict[int, float]], top_n: int) -> dict[str, Any]:
        content = []
        for tid, lps in zip(token_ids, token_lps):
            piece = self.piece(tid)
            alts = sorted(lps.items(), key=lambda kv: -kv[1])[:top_n] if top_n else []
            content.append(
                {
                    "token": piece,
                    "logprob": clamp(lps.get(tid, LOGPROB_FLOOR)),
                    "bytes": list(piece.encode("utf-8")),
                    "top_logprobs": [
                        {"token": self.piece(a), "logprob": clamp(lp), "bytes": list(self.piece(a).encode("utf-8"))}
                        for a, lp in alts
                    ],
                }
            )
        return {"content": content}
