"""Hostile and careless input (#25, first part): never a 5xx, early refusals, HTTP as vLLM
answers it. Each test uses examples of a class other than the issue's, then checks that the
server still answers a normal request."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from tests.server.conftest import API_KEY

OK = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}


def _still_serves(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json=OK)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("params", [
    {"top_p": 1e-320},  # rounds to 0 in fp32: every token would be dropped
    {"top_p": 2e-45, "top_k": 3},
    {"temperature": 1e-40},  # logits / temperature would overflow: greedy, as vLLM
    {"temperature": 9e-6, "top_p": 1e-300},
])
def test_degenerate_sampling_values_never_make_nans(client, params):
    r = client.post("/v1/completions", json={**OK, "max_tokens": 3, **params, "seed": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["text"]) >= 0
    greedy = client.post("/v1/completions", json={**OK, "max_tokens": 3, "return_token_ids": True}).json()
    if "temperature" in params:  # under the epsilon: the greedy tokens
        got = client.post("/v1/completions", json={**OK, "max_tokens": 3, **params, "return_token_ids": True}).json()
        assert got["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"]
    _still_serves(client)


@pytest.mark.parametrize("body", [
    '{"prompt": ' + "[" * 5000 + "]" * 5000 + ', "max_tokens": 1}',
    '{"prompt": "hi", "unused": ' + '{"a":' * 3000 + "1" + "}" * 3000 + "}",  # inside an ignored field
    '{"messages": [{"role": "user", "content": ' + "[" * 200 + "]" * 200 + "}]}",
])
def test_deep_nesting_is_a_400_before_parsing(client, body):
    for path in ("/v1/completions", "/v1/chat/completions"):
        start = time.monotonic()
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nests" in r.json()["error"]["message"], r.text
        assert time.monotonic() - start < 5
    _still_serves(client)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", '{"prompt": "a \\udfff b", "max_tokens": 1}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\ud83d"], "max_tokens": 1}', "prompt[1]"),
    ("/v1/completions", '{"prompt": "hi", "model": "\\udc80x", "max_tokens": 1}', "model"),
    ("/v1/completions", '{"prompt": "hi", "stop": ["\\ud800"], "max_tokens": 1}', "stop[0]"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x\\udbff"}]}', "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "user": "\\ud801"}', "user"),
])
def test_strings_utf8_cannot_carry_are_a_400_naming_the_field(client, path, body, param):
    r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "surrogate" in err["message"]
    _still_serves(client)


def test_body_over_the_limit_is_refused_by_its_declared_length(server, monkeypatch):
    """413 from the Content-Length header, before the body is sent."""
    import fastgemma.server.handling as handling

    monkeypatch.setattr(handling, "MAX_BODY_BYTES", 1000)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000000\r\n\r\n" + b"{" * 100)  # the rest never comes
        start = time.monotonic()
        reply = sock.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413") and time.monotonic() - start < 5, reply[:200]


def test_method_not_allowed_says_which_are(client):
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "MethodNotAllowedError"


def test_any_v1_path_needs_the_key(restricted_server):
    with httpx.Client(base_url=restricted_server.url, timeout=30) as c:
        for method, path in (("POST", "/v1/anything-unknown"), ("GET", "/v1/nothing/here"), ("GET", "/v1/completions")):
            r = c.request(method, path)
            assert r.status_code == 401, (path, r.status_code)
        key = {"Authorization": f"Bearer {API_KEY}"}
        assert c.post("/v1/anything-unknown", headers=key).status_code == 404
        assert c.get("/health").status_code == 200  # not under /v1


def test_error_messages_hold_no_object_reprs(client):
    gif = "R0lGODlhAQABAIAAAAUEBAAAACwAAAAAAQABAAACAkQBADs="[:20] + "A" * 20  # a GIF cut short
    for url in (f"data:image/gif;base64,{gif}", "data:image/png;base64,aGVsbG8gd29ybGQ="):
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert " at 0x" not in message and "<_io" not in message, message
    _still_serves(client)


def test_json_counts_and_depth_see_only_structure():
    from fastgemma.server.handling import json_counts, json_depth

    assert json_counts(json.dumps({"a": "[[,{{,", "b": [[1, 2]]}).encode()) == (3, 3)
    assert json_counts(b'{"x": "\\"[,", "y": "\\\\", "z": {}}') == (3, 2)  # escaped quote, escaped backslash
    assert json_depth({"a": "[[[[{{{{", "b": [[1]]}) == 3
    assert json_depth([[], {"a": [[[]]]}]) == 5 and json_depth(7) == 0


@pytest.mark.parametrize("prompt, what", [
    ("[" + ",".join(["7"] * 300_000) + "]", "JSON values"),  # about 2 MB of token ids
    ("[" + ",".join(["[7]"] * 20_000) + "]", "arrays / objects"),
])
def test_too_many_values_are_a_400_before_parsing(client, prompt, what):
    start = time.monotonic()
    r = client.post("/v1/completions", content=f'{{"prompt": {prompt}, "max_tokens": 1}}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and what in r.json()["error"]["message"], r.text
    assert time.monotonic() - start < 5
    _still_serves(client)


def test_brackets_and_commas_inside_strings_do_not_count(client):
    r = client.post("/v1/completions", json={**OK, "user": "{[,\"" * 100_000})  # 400k in a string
    assert r.status_code == 200, r.text


def test_a_large_body_does_not_stall_the_streams(server, client):
    """A body just under the limit (one 60 MB string, refused after parsing as too long in
    bytes) is parsed on the event loop: the tokens of a stream running beside it keep coming
    (the string scan that once found the nesting depth held the loop ~20 s on such a body)."""
    import threading

    body = {"prompt": "Go", "max_tokens": 1000, "temperature": 0, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []

    def read_stream() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c, c.stream("POST", "/v1/completions", json=body) as r:
            for _ in r.iter_lines():
                arrivals.append(time.monotonic())

    reader = threading.Thread(target=read_stream)
    reader.start()
    while len(arrivals) < 5:
        time.sleep(0.01)
    big = b'{"max_tokens": 1, "prompt": "' + "\u00e9x ".encode() * 7_500_000 + b'"}'
    sent = time.monotonic()
    r = client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    answered = time.monotonic()
    reader.join(timeout=120)
    assert r.status_code == 400 and "bytes, more than max_model_len" in r.json()["error"]["message"], r.text[:300]
    assert arrivals[-1] > answered, "the stream ended before the large request was answered: make it longer"
    during = [t for t in arrivals if sent <= t <= answered]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert during and max(gaps, default=0) < 2.0, (answered - sent, max(gaps, default=0))
    _still_serves(client)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_prompt_too_long_in_bytes_is_refused_before_tokenising(client, server, path):
    llm = server.state.llm
    huge = "word " * 1_000_000  # 5 MB, far more than max_model_len tokens can hold
    body = {"prompt": huge, "max_tokens": 1} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": huge}], "max_tokens": 1}
    start = time.monotonic()
    r = client.post(path, json=body)
    assert r.status_code == 400 and "bytes, more than max_model_len" in r.json()["error"]["message"], r.text
    assert time.monotonic() - start < 3
    limit = llm.max_model_len * llm.tokenizer.max_token_bytes
    assert limit < len(huge) and llm.tokenizer.max_token_bytes >= max(len(p) for p in ("hello", " world"))
    _still_serves(client)


@pytest.mark.parametrize("case", ["body-ids", "body-strings", "body-text"])
def test_the_costliest_bodies_stay_within_the_memory_budget(case):
    """README's budget: the bodies that cost the most to parse and validate (the most values,
    the most strings, the largest string) take at most 640 MiB. Peak resident memory of a
    fresh process (benchmarks/request_memory.py)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "request_memory.py"
    out = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 0 < json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"] < 640


def test_a_utf8_body_with_a_byte_order_mark_is_accepted(client):
    r = client.post("/v1/completions", content=b"\xef\xbb\xbf" + json.dumps(OK).encode(),
                    headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
