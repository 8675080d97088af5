"""Prometheus metrics of one server, served at `GET /metrics`.

Each app gets its own `CollectorRegistry`, so several servers (tests) can live in one
process. Names are prefixed `fastgemma:` like vLLM's `vllm:` metrics.

- requests by endpoint and HTTP status; prompt and generated tokens;
- time to first token (from arrival, so queueing is included) and inter-token latency;
- end-to-end request latency; requests waiting (for a job thread or a cache slot), requests
  running (sequences in the batch) and KV-cache usage, vLLM's names, read by routers such as
  the llm-d / Gateway API inference extension;
- speculative decoding (vLLM's `spec_decode_*` names): drafts, drafted and accepted tokens,
  accepted tokens per draft position;
- prefix caching (vLLM's names): prompt tokens looked up (`prefix_cache_queries`) and found
  kept (`prefix_cache_hits`);
- the process: prometheus-client's process collector (`process_resident_memory_bytes`,
  `process_cpu_seconds_total`, open file descriptors, start time).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu seconds, open fds
        r, labels = self.registry, {"model_name": model_name}
        self.requests = Counter(
            "fastgemma:requests", "HTTP requests answered, by endpoint and status code.",
            ["model_name", "endpoint", "status"], registry=r,
        )
        self.prompt_tokens = Counter(
            "fastgemma:prompt_tokens", "Prompt tokens processed.", ["model_name"], registry=r
        ).labels(**labels)
        self.generation_tokens = Counter(
            "fastgemma:generation_tokens", "Tokens generated.", ["model_name"], registry=r
        ).labels(**labels)
        self.ttft = Histogram(
            "fastgemma:time_to_first_token_seconds", "Arrival to first generated token (queueing included).",
            ["model_name"], buckets=TTFT_BUCKETS, registry=r,
        ).labels(**labels)
        self.itl = Histogram(
            "fastgemma:inter_token_latency_seconds", "Time between consecutive generated tokens.",
            ["model_name"], buckets=ITL_BUCKETS, registry=r,
        ).labels(**labels)
        self.e2e = Histogram(
            "fastgemma:e2e_request_latency_seconds", "Arrival to the end of engine work for a request.",
            ["model_name"], buckets=E2E_BUCKETS, registry=r,
        ).labels(**labels)
        self.queue_depth = Gauge(
            "fastgemma:num_requests_waiting", "Requests waiting for the engine (a job thread or a cache slot).",
            ["model_name"], registry=r
        ).labels(**labels)
        self.running = Gauge(
            "fastgemma:num_requests_running", "Sequences the engine is decoding together (each holds a cache slot).",
            ["model_name"], registry=r
        ).labels(**labels)
        self.kv_cache_usage = Gauge(
            "fastgemma:kv_cache_usage_perc", "Fraction of the KV-cache slots held by running sequences (0-1).",
            ["model_name"], registry=r
        ).labels(**labels)
        self.spec_drafts = Counter(
            "fastgemma:spec_decode_num_drafts", "Verification steps that carried drafted tokens.", ["model_name"],
            registry=r,
        ).labels(**labels)
        self.spec_draft_tokens = Counter(
            "fastgemma:spec_decode_num_draft_tokens", "Drafted tokens verified.", ["model_name"], registry=r
        ).labels(**labels)
        self.spec_accepted_tokens = Counter(
            "fastgemma:spec_decode_num_accepted_tokens", "Drafted tokens kept.", ["model_name"], registry=r
        ).labels(**labels)
        self.spec_accepted_per_pos = Counter(
            "fastgemma:spec_decode_num_accepted_tokens_per_pos", "Drafted tokens kept, by position in the draft.",
            ["model_name", "position"], registry=r,
        )
        self.prefix_cache_queries = Counter(
            "fastgemma:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", ["model_name"], registry=r
        ).labels(**labels)
        self.prefix_cache_hits = Counter(
            "fastgemma:prefix_cache_hits", "Prompt tokens found in the prefix cache (not computed).", ["model_name"],
            registry=r,
        ).labels(**labels)
        self.model_name = model_name

    def count_speculation(self, stats) -> None:
        """Add one request's `SpecStats` (engine/speculative.py) to the counters."""
        self.spec_drafts.inc(stats.num_drafts)
        self.spec_draft_tokens.inc(stats.num_draft_tokens)
        self.spec_accepted_tokens.inc(stats.num_accepted_tokens)
        for pos, n in enumerate(stats.accepted_per_position):
            self.spec_accepted_per_pos.labels(self.model_name, str(pos)).inc(n)

    def count_prefix_cache(self, queries: int, hits: int) -> None:
        self.prefix_cache_queries.inc(queries)
        self.prefix_cache_hits.inc(hits)

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(self.model_name, endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
