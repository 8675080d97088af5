"""Pieces without a model: env settings, error mapping, the worker queue."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import ValidationError

from fastgemma.server import protocol as P
from fastgemma.server.errors import error_body, from_validation_error
from fastgemma.server.serve import settings_from_env
from fastgemma.server.worker import Cancelled, QueueFull, TokenEvent, Worker


def test_settings_from_env():
    env = {"MODEL_ID": "google/gemma-3-1b-it", "SERVED_MODEL_NAME": "gemma", "HOST": "0.0.0.0", "PORT": "9001"}
    assert settings_from_env(environ=env) == {"model": "google/gemma-3-1b-it", "served_model_name": "gemma", "host": "0.0.0.0", "port": 9001}
    explicit = settings_from_env("m", "n", "127.0.0.2", 1234, environ=env)
    assert explicit == {"model": "m", "served_model_name": "n", "host": "127.0.0.2", "port": 1234}
    assert settings_from_env(environ={}) == {"model": None, "served_model_name": None, "host": "127.0.0.1", "port": 8000}
    with pytest.raises(ValueError):
        settings_from_env(environ={"PORT": "eighty"})
    with pytest.raises(ValueError):
        settings_from_env(port=70000, environ={})


def test_validation_errors_name_the_field():
    with pytest.raises(ValidationError) as e:
        P.CompletionRequest.model_validate({"prompt": [1, 2.5]})
    err = from_validation_error(e.value)
    assert err.status == 400 and err.param == "prompt"
    with pytest.raises(ValidationError) as e:
        P.ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}, {"role": "bot"}]})
    assert from_validation_error(e.value).param == "messages.1.role"
    assert error_body(429, "full") == {"error": {"message": "full", "type": "RateLimitError", "param": None, "code": 429}}


def test_requests_ignore_unknown_fields_and_accept_int_floats():
    req = P.CompletionRequest.model_validate({"prompt": "x", "temperature": 0, "whatever": [1], "stream_options": {"include_usage": True, "x": 1}})
    assert req.temperature == 0.0 and req.prompts() == ["x"]
    assert P.CompletionRequest.model_validate({"prompt": [[1, 2], [3]]}).prompts() == [[1, 2], [3]]
    assert P.ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}).messages[0].text() == "a\nb"


def test_worker_fifo_bounded_queue_and_cancel():
    async def main():
        loop = asyncio.get_running_loop()
        worker = Worker(max_queue=2)
        gate, order = threading.Event(), []

        def blocking(job):
            gate.wait(10)
            order.append("a")
            return "a"

        def tagged(tag):
            def fn(job):
                order.append(tag)
                job.emit(TokenEvent(0, tag + "-item"))
                return tag

            return fn

        a = worker.submit(blocking, loop)
        while not worker.num_running:
            await asyncio.sleep(0.001)
        b = worker.submit(tagged("b"), loop)
        c = worker.submit(tagged("c"), loop)
        with pytest.raises(QueueFull):
            worker.submit(tagged("d"), loop)
        b.cancel()  # frees its slot at once
        assert worker.num_waiting == 1
        d = worker.submit(tagged("d"), loop)
        gate.set()
        assert await a.result() == "a"
        with pytest.raises(Cancelled):
            await b.result()
        assert await c.next() == (True, TokenEvent(0, "c-item"))
        assert await c.next() == (False, "c")
        assert await d.result() == "d"
        assert order == ["a", "c", "d"]

        def failing(job):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            await worker.submit(failing, loop).result()
        assert await worker.submit(tagged("e"), loop).result() == "e"  # the worker survived
        worker.stop()

    asyncio.run(main())


def test_the_model_is_loaded_on_a_thread_that_ends():
    from fastgemma.server.serve import load_on_passing_thread

    seen: list[threading.Thread] = []

    def load():
        seen.append(threading.current_thread())
        return 42

    assert load_on_passing_thread(load) == 42
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()

    def fail():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        load_on_passing_thread(fail)
