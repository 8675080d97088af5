"""Fixtures for the verifier tests: small input files, a real `fastgemma serve`, a fake server.

- `small_prompts` / `small_ppl` (tests/conftest.py): the challenge files cut down;
- `served_tiny`: `fastgemma serve` on the tiny random Gemma 3 (real tokenizer) started by the
  verifier's own `ServeProcess`, once per session;
- `fake_server(mode)`: a stdlib HTTP server that answers like an OpenAI endpoint but breaks
  one field or route, for the error tests.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fastgemma.config import EngineConfig
from fastgemma.verify.endpoint import ServeProcess, free_port, serve_command


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.fixture(scope="session")
def served_tiny(tiny_text_model, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = serve_command([str(tiny_text_model), "--dtype", "float32", "--served-model-name", "tiny"], port)
    with ServeProcess(command, port, log, ready_timeout_s=180) as proc:
        pid = proc.pid
        yield proc
    assert not pid_alive(pid), "fastgemma serve outlived its ServeProcess"


@pytest.fixture(scope="session")
def tiny_reference(tiny_text_model):
    from fastgemma.verify.reference import InProcessReference

    return InProcessReference(EngineConfig(model=str(tiny_text_model), dtype="float32"), progress=False)


class _FakeHandler(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        mode = type(self).mode
        if self.path == "/v1/chat/completions":
            if mode == "chat_500":
                return self._send(500, {"error": {"message": "engine exploded"}})
            usage = {"prompt_tokens": 5, "completion_tokens": req["max_tokens"], "total_tokens": 5 + req["max_tokens"]}
            if mode == "no_usage":
                usage = {}
            return self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}], "usage": usage})
        n = req["max_tokens"]
        choice = {"index": 0, "text": "x", "token_ids": [7] * n}
        if mode == "no_token_ids":
            choice.pop("token_ids")
        if req.get("prompt_logprobs") is not None and mode != "no_prompt_logprobs":
            ids = req["prompt"]
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in ids[1:]]
            if mode == "logprobs_without_token":
                choice["prompt_logprobs"][3] = {"99999": {"logprob": -0.5, "rank": 1}}
        self._send(200, {"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": n}})


@pytest.fixture
def fake_server():
    """fake_server(mode) -> base URL; modes: ok, chat_500, no_usage, no_token_ids, no_prompt_logprobs,
    logprobs_without_token."""
    servers = []

    def start(mode: str) -> str:
        handler = type("Handler", (_FakeHandler,), {"mode": mode})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()
