"""Graceful drain (server/serve.py `DrainingServer`, vLLM's `--shutdown-timeout`): on SIGTERM
new requests get 503 + Retry-After and /health says draining, the requests in flight finish
within the timeout, then the process exits."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest
from tests.server.serve_process import serve_process

from fastgemma import LLM
from fastgemma.server import ServerThread

LONG = 200


@pytest.fixture
def own_llm(tiny_text_model) -> LLM:
    """A server of its own: draining ends it."""
    return LLM(str(tiny_text_model), dtype="float32", max_num_seqs=2)


def _stream_across(url: str, body: dict, action) -> tuple[list[int], bool, dict]:
    """Stream a completion and call `action()` once its first chunk has arrived; the stream's
    token ids, whether `[DONE]` ended it, and its last chunk."""
    chunks, done = [], False
    with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 1:
                    action()
    return [t for ch in chunks for t in ch["choices"][0].get("token_ids") or []], done, chunks[-1]


def test_draining_refuses_new_requests_and_exits_once_none_is_in_flight(own_llm):
    server = ServerThread(own_llm, shutdown_timeout=30).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.get("/health").status_code == 200
            server.state.handling += 1  # a request inside its handler (deterministic stand-in)
            server.server.drain()
            for method, path, body in [("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
                                       ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                                       ("GET", "/v1/models", None)]:
                r = c.request(method, path, json=body)
                assert r.status_code == 503, (path, r.text)
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "ServiceUnavailableError" and "draining" in r.json()["error"]["message"]
            health = c.get("/health")
            assert health.status_code == 503 and "draining" in health.json()["error"]["message"]
            time.sleep(0.3)
            assert server.thread.is_alive()  # still waiting for the one in flight
        server.state.handling -= 1
        server.thread.join(10)
        assert not server.thread.is_alive()
    finally:
        server.stop()


def test_a_stream_in_flight_finishes_in_full(own_llm):
    server = ServerThread(own_llm, shutdown_timeout=60).start()
    body = {"prompt": "Go on and on", "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    try:
        tokens, done, last = _stream_across(server.url, body, server.server.drain)
        assert done and len(tokens) == LONG and last["choices"][0]["finish_reason"] == "length"
        server.thread.join(10)
        assert not server.thread.is_alive()
    finally:
        server.stop()


def test_the_timeout_ends_a_drain_that_would_never_finish(own_llm):
    server = ServerThread(own_llm, shutdown_timeout=0.3).start()
    try:
        started = time.monotonic()
        server.state.handling += 1  # never finishes: only the timeout ends the drain
        server.server.drain()
        server.thread.join(10)
        assert not server.thread.is_alive() and time.monotonic() - started < 5
    finally:
        server.stop()


def test_sigterm_to_fastgemma_serve_drains_then_exits(tiny_gemma3, helpers):
    with serve_process(str(tiny_gemma3), "--shutdown-timeout", "60") as (proc, url, _):
        ids = list(range(10, 30))
        body = {"prompt": ids, "max_tokens": 150, "temperature": 0, "ignore_eos": True, "stream": True,
                "return_token_ids": True}

        def sigterm_then_refused() -> None:
            proc.send_signal(signal.SIGTERM)
            helpers.wait_for(lambda: httpx.get(url + "/health", timeout=5).status_code == 503, what="/health to say draining")
            refused = httpx.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 1}, timeout=5)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"

        tokens, done, _ = _stream_across(url, body, sigterm_then_refused)
        assert done and len(tokens) == 150, len(tokens)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
