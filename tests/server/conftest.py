"""Fixtures for the server tests: a tiny random Gemma 3 with the real Gemma tokenizer, served.

The model folder (vocab 262144, hidden 32, 2 layers) is built once per session by
transformers' `save_pretrained`; the tokenizer files come from the embedded model's GGUF
metadata folder, so text prompts and the chat template work. Two `LLM`s load it: `llm`
behind the main server (8 sequences batched), `ref_llm` for in-process reference results,
so references never touch the served engine from another thread; the restricted server has
its own, one sequence at a time.
"""

from __future__ import annotations

import time

import httpx
import pytest

from fastgemma import LLM
from fastgemma.server import ServerThread

API_KEY = "test-secret-key"


@pytest.fixture(scope="session")
def llm(tiny_text_model) -> LLM:
    return LLM(str(tiny_text_model), dtype="float32")


@pytest.fixture(scope="session")
def ref_llm(tiny_text_model) -> LLM:
    return LLM(str(tiny_text_model), dtype="float32")


@pytest.fixture(scope="session")
def server(llm):
    with ServerThread(llm, served_model_name="tiny-gemma", max_queue=64) as s:
        yield s


@pytest.fixture(scope="session")
def restricted_server(tiny_text_model):
    """api key required, one sequence at a time and one waiting request: for the 401 and 429 tests."""
    one = LLM(str(tiny_text_model), dtype="float32", max_num_seqs=1)
    with ServerThread(one, served_model_name="tiny-gemma", api_key=API_KEY, max_queue=1) as s:
        yield s


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def wait_idle(server: ServerThread, timeout: float = 30.0) -> float:
    """Wait until the server's worker has nothing running or waiting; return the seconds waited."""
    start = time.monotonic()
    worker = server.state.worker
    while worker.num_running or worker.num_waiting:
        if time.monotonic() - start > timeout:
            raise AssertionError("the server's worker did not become idle")
        time.sleep(0.01)
    return time.monotonic() - start


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """The value of one sample in /metrics (0.0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@pytest.fixture
def helpers():
    """wait_idle(server), wait_for(predicate), metric(client, name, **labels)."""

    class Helpers:
        pass

    h = Helpers()
    h.wait_idle, h.wait_for, h.metric = wait_idle, wait_for, metric
    return h
