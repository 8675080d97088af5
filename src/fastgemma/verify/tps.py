"""Stage tps: served decode speed with sglang bench_serving's methodology (v0.5.2, `vllm-chat`).

What is timed: `len(prompts)` non-streaming `/v1/chat/completions` requests, one at a time
(max concurrency 1, request rate inf), each one user message with `max_tokens` = output len
and `ignore_eos`. Before the timed run, `warmup` requests of the first prompt with
`max_tokens = min(output len, 32)`, as bench_serving sends them; they are not counted.

    output_tps = Σ usage.completion_tokens / wall-clock duration of the timed run
    total_tps  = Σ (usage.prompt_tokens + usage.completion_tokens) / that duration

so prefill, HTTP and detokenisation all count. Latency: per request, send to full response.
bench_serving's non-streaming TTFT is the whole latency; here TTFT is measured instead by one
extra `max_tokens = 1` request per prompt after the timed run (prefill + one token + HTTP),
outside the timed window. (bench_serving's total throughput counts prompt tokens of the raw
text; ours counts the chat-formatted prompt the server reports, so total_tps is a bit higher.)

`stop_below_tps` (the tuner's pruning): once the timed run has taken longer than its output
tokens at that rate would take, its TPS is certain to be lower, so it stops after the request
in flight and raises `TooSlow` (with the rate so far). `fastgemma verify` never sets it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from fastgemma.verify.client import Client
from fastgemma.verify.data import Prompt

WARMUP_MAX_TOKENS = 32  # bench_serving: warm-up output_len = min(output_len, 32)


@dataclass(frozen=True)
class TpsRequest:
    index: int  # position in the timed run
    key: str  # prompt id
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    ttft_s: float

    @property
    def tps(self) -> float:
        """This request's own rate: completion tokens / its latency."""
        return self.completion_tokens / self.latency_s if self.latency_s > 0 else 0.0


@dataclass(frozen=True)
class TpsResult:
    stage: str
    output_len: int
    duration_s: float  # wall clock of the timed run only
    requests: list[TpsRequest] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.requests)

    @property
    def input_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.duration_s

    @property
    def total_tps(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s

    @property
    def off_length(self) -> list[TpsRequest]:
        """Requests that did not emit exactly output_len tokens (ignore_eos not honoured)."""
        return [r for r in self.requests if r.completion_tokens != self.output_len]

    def stats(self) -> dict[str, float]:
        lat = [1000 * r.latency_s for r in self.requests]
        ttft = [1000 * r.ttft_s for r in self.requests]
        return {
            "mean_latency_ms": statistics.mean(lat), "median_latency_ms": statistics.median(lat),
            "p99_latency_ms": float(np.percentile(lat, 99)),
            "mean_ttft_ms": statistics.mean(ttft), "median_ttft_ms": statistics.median(ttft),
            "p99_ttft_ms": float(np.percentile(ttft, 99)),
        }

    def to_dict(self) -> dict[str, object]:
        return {
            "tps": self.output_tps, "output_tps": self.output_tps, "total_tps": self.total_tps,
            "duration_s": self.duration_s, "num_requests": len(self.requests), "output_len": self.output_len,
            "output_tokens": self.output_tokens, "input_tokens": self.input_tokens,
            "off_length_requests": len(self.off_length), **self.stats(),
        }


class TooSlow(Exception):
    """The timed run cannot reach `stop_below_tps`; `rate` = tokens so far / time so far."""

    def __init__(self, rate: float, threshold: float):
        super().__init__(f"{rate:.2f} tok/s so far, certain to end below {threshold:.2f}")
        self.rate, self.threshold = rate, threshold


def run_tps(client: Client, model: str, prompts: list[Prompt], output_len: int, warmup: int,
            stage: str = "tps", progress: bool = True, stop_below_tps: float | None = None) -> TpsResult:
    bar = tqdm(total=warmup + 2 * len(prompts), desc=f"{stage}: warm-up, timed run, ttft", unit="req",
               disable=not progress, leave=False)
    with bar:
        for _ in range(warmup):
            client.chat(stage, model, prompts[0].text, min(output_len, WARMUP_MAX_TOKENS))
            bar.update()
        replies = []
        start = time.perf_counter()
        for prompt in prompts:
            replies.append(client.chat(stage, model, prompt.text, output_len))
            bar.update()
            elapsed = time.perf_counter() - start
            if stop_below_tps is not None and elapsed * stop_below_tps > len(prompts) * output_len:
                raise TooSlow(sum(r.completion_tokens for r in replies) / elapsed, stop_below_tps)
        duration = time.perf_counter() - start
        ttfts = []
        for prompt in prompts:
            ttfts.append(client.chat(stage, model, prompt.text, 1).latency_s)
            bar.update()
    requests = [
        TpsRequest(i, p.key, r.prompt_tokens, r.completion_tokens, r.latency_s, t)
        for i, (p, r, t) in enumerate(zip(prompts, replies, ttfts))
    ]
    return TpsResult(stage, output_len, duration, requests)
