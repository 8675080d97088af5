"""Many clients at once, clients that go away, a full queue (429) and the API key (401)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from conftest import API_KEY  # noqa: E402  (pytest puts this folder on sys.path)
from fastgemma import SamplingParams

MODEL = "tiny-gemma"
LONG = 900  # tokens that take far longer than any test waits


def _sse_lines(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def test_concurrent_clients_match_sequential_run(server, ref_llm):
    jobs = []
    for i in range(6):
        prompt = f"Request number {i} says:"
        kind = ("completion", "chat", "stream-chat")[i % 3]
        jobs.append((kind, prompt, 6 + i))

    def run(job):
        kind, prompt, n = job
        oai = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        if kind == "completion":
            return oai.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
        messages = [{"role": "user", "content": prompt}]
        if kind == "chat":
            return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}).choices[0].message.content
        stream = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0, stream=True, extra_body={"ignore_eos": True})
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(run, jobs))

    for (kind, prompt, n), answer in zip(jobs, answers):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        if kind == "completion":
            expected = ref_llm.generate(prompt, params)[0].text
        else:
            expected = ref_llm.generate([ref_llm.chat_prompt_ids([{"role": "user", "content": prompt}])], params)[0].text
        assert answer == expected, (kind, prompt)


def test_stream_disconnect_cancels_then_next_request_works(server, client, helpers):
    before = helpers.metric(client, "fastgemma:generation_tokens_total")
    body = {"prompt": "Go on and on", "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as c2:
        with c2.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            chunks = _sse_lines(r)
            next(chunks), next(chunks)
    # the connection is closed: the engine stops long before LONG tokens
    waited = helpers.wait_idle(server, timeout=20)
    generated = helpers.metric(client, "fastgemma:generation_tokens_total") - before
    assert 2 <= generated < LONG / 2, (generated, waited)
    r = client.post("/v1/completions", json={"prompt": "after", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_non_stream_disconnect_cancels(server, client, helpers):
    before = helpers.metric(client, "fastgemma:generation_tokens_total")
    body = {"messages": [{"role": "user", "content": "Talk forever"}], "max_tokens": LONG, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60, read=1.0)) as c2:
        with pytest.raises(httpx.ReadTimeout):
            c2.post("/v1/chat/completions", json=body)
    helpers.wait_idle(server, timeout=20)
    generated = helpers.metric(client, "fastgemma:generation_tokens_total") - before
    assert 1 <= generated < LONG / 2
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_api_key(restricted_server):
    with httpx.Client(base_url=restricted_server.url, timeout=60) as c:
        body = {"prompt": "x", "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}, {"Authorization": "Basic " + API_KEY}):
            r = c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["code"] == 401 and r.json()["error"]["type"] == "AuthenticationError"
        assert c.get("/v1/models").status_code == 401
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL
        assert c.post("/v1/completions", json=body, headers=AUTH).status_code == 200
    oai = openai.OpenAI(base_url=restricted_server.url + "/v1", api_key=API_KEY, max_retries=0)
    assert oai.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=restricted_server.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_queue_full_429_and_cancel_frees_the_slot(restricted_server, helpers):
    """max_queue=1: one running + one waiting; the next gets 429 until a slot frees."""
    s = restricted_server
    long_body = {"prompt": "Keep going", "max_tokens": LONG, "ignore_eos": True, "stream": True}
    short_body = {"prompt": "short", "max_tokens": 3, "temperature": 0}
    with httpx.Client(base_url=s.url, timeout=60, headers=AUTH) as c, httpx.Client(base_url=s.url, timeout=60, headers=AUTH) as c_run:
        waiting = lambda: helpers.metric(c, "fastgemma:num_requests_waiting")  # noqa: E731
        with c_run.stream("POST", "/v1/completions", json=long_body) as running:
            assert running.status_code == 200
            a_chunks = _sse_lines(running)  # kept: dropping it would close the connection
            next(a_chunks)  # A is running now
            assert s.state.worker.num_running == 1

            # B waits; it gives up (client timeout) and its slot is freed while A still runs.
            def waiter_that_leaves():
                with httpx.Client(base_url=s.url, headers=AUTH, timeout=httpx.Timeout(60, read=1.5)) as c3:
                    try:
                        r = c3.post("/v1/completions", json=short_body)
                    except httpx.ReadTimeout:
                        return
                    print("B GOT", r.status_code, r.text, flush=True)
                    raise AssertionError("B was answered")

            t = threading.Thread(target=waiter_that_leaves)
            t.start()
            helpers.wait_for(lambda: waiting() == 1, what="B to wait")
            r = c.post("/v1/completions", json=short_body)
            assert r.status_code == 429, r.text
            assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "RateLimitError", "param": None, "code": 429}
            t.join()
            helpers.wait_for(lambda: waiting() == 0, timeout=5, what="B's slot to free")
            assert s.state.worker.num_running == 1  # A still running: the slot came from B leaving

            # C takes the freed slot and is answered once A goes away.
            result = {}
            t = threading.Thread(target=lambda: result.setdefault("r", c.post("/v1/completions", json=short_body)))
            t.start()
            helpers.wait_for(lambda: waiting() == 1, what="C to wait")
            assert c.post("/v1/completions", json=short_body).status_code == 429
            a_chunks.close()
        # A's client closed its stream: A is cancelled, C runs.
        t.join(30)
        assert result["r"].status_code == 200
        assert result["r"].json()["usage"]["completion_tokens"] == 3
        helpers.wait_idle(s)
        assert helpers.metric(c, "fastgemma:requests_total", endpoint="/v1/completions", status="429") == 2
        assert c.post("/v1/completions", json=short_body).status_code == 200


def test_bad_requests_during_eight_streams_change_nothing(server, ref_llm, helpers):
    """Eight greedy streams decode together while the battery of bad requests arrives; every
    bad one gets its 4xx and every stream its batch-1 tokens."""
    from test_bad_requests import BAD  # noqa: E402  (this folder is on sys.path)

    prompts = [f"Stream {i} tells a story about" for i in range(8)]
    n = 24

    def good(prompt: str) -> list[int]:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        with httpx.Client(base_url=server.url, timeout=120) as c, c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            return [t for chunk in _sse_lines(r) for t in chunk["choices"][0].get("token_ids") or []]

    def bad(case) -> tuple[str, int, int]:
        _, path, body, status, _ = case
        with httpx.Client(base_url=server.url, timeout=60) as c:
            r = c.post(path, content=body) if isinstance(body, str) else c.post(path, json=body)
        return case[0], r.status_code, status

    with ThreadPoolExecutor(8 + 4) as pool, httpx.Client(base_url=server.url, timeout=60) as c:
        streams = [pool.submit(good, p) for p in prompts]
        helpers.wait_for(lambda: helpers.metric(c, "fastgemma:num_requests_running") >= 2, what="the streams to run")
        refused = list(pool.map(bad, BAD))
        got = [s.result() for s in streams]
    assert all(code == want for _, code, want in refused), [r for r in refused if r[1] != r[2]]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    assert got == [o.token_ids for o in ref_llm.generate(prompts, params)]
    assert got == [ref_llm.generate(p, params)[0].token_ids for p in prompts[:2]] + got[2:]  # alone, too


def test_the_prompts_of_one_completion_request_decode_together(server, client, helpers):
    """A list of prompts runs as one batch (not one prompt after another): every choice streams
    from the start, and the engine holds them all at once."""
    body = {"prompt": ["first", "second", "third"], "n": 2, "max_tokens": LONG, "temperature": 0,
            "ignore_eos": True, "stream": True}
    seen: set[int] = set()
    with httpx.Client(base_url=server.url, timeout=60) as c2:
        with c2.stream("POST", "/v1/completions", json=body) as r:
            for i, chunk in enumerate(_sse_lines(r)):
                seen.update(c["index"] for c in chunk["choices"])
                if len(seen) == 6 or i == 60:
                    break
            running = helpers.metric(client, "fastgemma:num_requests_running")
    helpers.wait_idle(server, timeout=20)
    assert seen == set(range(6)) and running == 6
