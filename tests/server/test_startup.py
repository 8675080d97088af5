"""`fastgemma serve` starting up: a busy port fails before anything loads, the KV cache's
size is printed, and "serving" only once requests are answered."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import requests
from tests.server.serve_process import serve_process

from fastgemma.config import EngineConfig
from fastgemma.server import serve


def test_a_busy_port_fails_before_loading(monkeypatch):
    loaded = []
    monkeypatch.setattr("fastgemma.LLM", type("Recorder", (), {"from_config": staticmethod(loaded.append)}))
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}.*another --port"):
            serve.run_server(EngineConfig(), host="127.0.0.1", port=port)
    assert loaded == []  # the model was never asked for


def test_the_cli_says_so_in_one_line_and_exits_non_zero():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "fastgemma.cli.main", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")


def test_kv_cache_line_then_serving_once_it_answers(tiny_gemma3):
    with serve_process(str(tiny_gemma3), "--max-num-seqs", "2") as (_, url, lines):
        # "serving" is printed once uvicorn has started: the next request is answered
        assert requests.get(f"{url}/v1/models", timeout=10).status_code == 200
        kv = next(line for line in lines if "KV cache:" in line)
        assert "KV cache: 2 sequences x up to 256 tokens, " in kv and "MiB at most" in kv
        assert "; prefix cache: up to 512 MiB of 512-token prompt chunks" in kv
        assert lines.index(kv) < len(lines) - 1
