"""`fastgemma bench serve`: what a served endpoint delivers at several concurrencies.

Protocol (as sglang's bench_serving and vLLM's benchmark_serving measure an endpoint): at each
concurrency C, C clients stream `/v1/chat/completions` requests, each client taking the next
prompt as soon as its previous request ends, `rounds` requests per client; every request
asks for exactly `output_len` greedy tokens (end-of-sequence ignored). Prompts are the first
human turns of the challenge's sharegpt items, the same list at every concurrency. Reported
per concurrency: aggregate output tok/s (all output tokens / wall time from the first request
to the last answer), time to first token and inter-token latency (gaps between streamed
chunks, all requests pooled), median and p99. One short untimed request first.

The endpoint is `url` (any OpenAI-compatible server: llama.cpp's llama-server, vLLM, ...) or,
without one, a `fastgemma serve` started here as a child process with the given engine
options on a free loopback port (its own process, as users run it; verify/endpoint.py's
`ServeProcess`, as `fastgemma verify` starts it), stopped at the end.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastgemma.bench.decode import load_sharegpt_prompts
from fastgemma.config import EngineConfig
from fastgemma.data import PROMPTS_FILE, challenge_file
from fastgemma.verify.endpoint import ServeProcess, free_port, serve_command


@dataclass(frozen=True)
class ServeBenchConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)  # the fastgemma server to start (no url)
    url: str | None = None  # an already running endpoint instead (its /v1 is appended)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    num_prompts: int = 16
    output_len: int = 256
    rounds: int = 2  # requests per client at each concurrency
    prompts: Path | None = None  # sharegpt JSON; None = the packaged challenge prompts
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("--concurrency takes positive integers, e.g. 1,2,4,8")
        for name, value in (("num-prompts", self.num_prompts), ("output-len", self.output_len), ("rounds", self.rounds)):
            if value < 1:
                raise ValueError(f"--{name} must be >= 1 (got {value})")


def _request(client, model: str, prompt: str, output_len: int) -> dict[str, Any]:
    """One streamed chat request: its TTFT, chunk gaps and output tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": output_len,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    times, tokens = [], None
    with client.stream("POST", "/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens", tokens)
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError("the response streamed no content")
    return {"ttft": times[0] - start, "gaps": [b - a for a, b in zip(times, times[1:])],
            "tokens": tokens if tokens is not None else len(times)}


def run_level(base_url: str, model: str, prompts: list[str], concurrency: int, rounds: int, output_len: int) -> dict:
    import httpx

    jobs = [prompts[i % len(prompts)] for i in range(concurrency * rounds)]
    lock, results, errors = threading.Lock(), [], []

    def client() -> None:
        # a new connection per request: llama-server closes a connection after a stream
        # (a reused one then fails with "Server disconnected"); loopback connects cost ~0.1 ms
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=base_url + "/v1", timeout=3600, limits=no_reuse) as c:
            while True:
                with lock:
                    if not jobs:
                        return
                    prompt = jobs.pop(0)
                try:
                    out = _request(c, model, prompt, output_len)
                except Exception as e:  # reported, not hidden
                    errors.append(str(e))
                    return
                with lock:
                    results.append(out)

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed at concurrency {concurrency}: {errors[0]}")
    ttft = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "output_tokens": tokens, "wall_s": round(wall, 3),
        "output_tok_s": round(tokens / wall, 2),
        "ttft_ms_median": round(1000 * statistics.median(ttft), 1), "ttft_ms_p99": round(1000 * float(np.percentile(ttft, 99)), 1),
        "itl_ms_median": round(1000 * statistics.median(gaps), 2) if gaps else None,
        "itl_ms_p99": round(1000 * float(np.percentile(gaps, 99)), 2) if gaps else None,
    }


def run_serve_bench(cfg: ServeBenchConfig, log=print) -> dict:
    import httpx

    prompts = load_sharegpt_prompts(cfg.prompts or challenge_file(PROMPTS_FILE), cfg.num_prompts)
    if cfg.url:
        server = nullcontext(None)
    else:  # fastgemma serve as a child process (verify/endpoint.py), stopped on the way out
        port = free_port()
        command = serve_command(cfg.engine.serve_args(), port)
        log(f"starting: fastgemma serve {' '.join(command[4:])}")
        server = ServeProcess(command, port, Path(tempfile.mkdtemp()) / "serve.log", cfg.startup_timeout_s)
    with server as proc:
        base = (cfg.url or proc.url).rstrip("/").removesuffix("/v1")
        model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
        with httpx.Client(base_url=base + "/v1", timeout=600) as c:
            _request(c, model, prompts[0], 4)  # warm-up, untimed
        levels = []
        for n in cfg.concurrency:
            log(f"concurrency {n}: {n * cfg.rounds} requests of {cfg.output_len} tokens")
            levels.append(run_level(base, model, prompts, n, cfg.rounds, cfg.output_len))
    first = levels[0]["output_tok_s"]
    for level in levels:
        level["vs_first"] = round(level["output_tok_s"] / first, 2)
    return {"endpoint": cfg.url or "fastgemma serve " + " ".join(cfg.engine.serve_args()), "model": model,
            "output_len": cfg.output_len, "rounds": cfg.rounds, "levels": levels}


def render_table(result: dict) -> None:
    print(f"endpoint: {result['endpoint']} (model {result['model']}, {result['output_len']} tokens per request)")
    print(f"{'conc':>5} {'reqs':>5} {'out tok/s':>10} {'x conc1':>8} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'ITL med':>8} {'ITL p99':>8}  (ms)")
    for r in result["levels"]:
        print(f"{r['concurrency']:>5} {r['requests']:>5} {r['output_tok_s']:>10.2f} {r['vs_first']:>8.2f} "
              f"{r['ttft_ms_median']:>9.1f} {r['ttft_ms_p99']:>9.1f} {r['itl_ms_median']:>8.2f} {r['itl_ms_p99']:>8.2f}")
