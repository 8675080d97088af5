"""verify/client.py: every malformed or failed response names the stage and the field."""

from __future__ import annotations

import httpx
import pytest

from fastgemma.verify.client import Client, StageError, api_base
from fastgemma.verify.endpoint import free_port


def _client(handler) -> Client:
    return Client("http://fake", transport=httpx.MockTransport(handler))


def _json(body, status=200):
    return lambda request: httpx.Response(status, json=body)


def test_api_base():
    assert api_base("http://h:1/v1/") == api_base("http://h:1/") == "http://h:1"


def test_missing_token_ids():
    c = _client(_json({"choices": [{"index": 0, "text": "x"}]}))
    with pytest.raises(StageError, match=r"^stage audit: response has no choices\[0\]\.token_ids$"):
        c.complete_ids("audit", "m", [1, 2], 4)


def test_token_ids_not_integers():
    c = _client(_json({"choices": [{"token_ids": [1, "2"]}]}))
    with pytest.raises(StageError, match=r"stage audit: response field choices\[0\]\.token_ids is not a list of integer"):
        c.complete_ids("audit", "m", [1, 2], 4)


def test_missing_prompt_logprobs():
    c = _client(_json({"choices": [{"token_ids": [3]}]}))
    with pytest.raises(StageError, match=r"^stage ppl: response has no choices\[0\]\.prompt_logprobs$"):
        c.prompt_token_logprobs("ppl", "m", [1, 2, 3])


def test_prompt_logprobs_without_the_prompt_token():
    entries = [None, {"2": {"logprob": -1.0}}, {"9": {"logprob": -0.1}}]
    c = _client(_json({"choices": [{"prompt_logprobs": entries}]}))
    with pytest.raises(StageError, match=r"stage ppl: .*prompt_logprobs\[2\] has no logprob for the prompt token 3"):
        c.prompt_token_logprobs("ppl", "m", [1, 2, 3])


def test_prompt_logprobs_wrong_length():
    c = _client(_json({"choices": [{"prompt_logprobs": [None, {"2": {"logprob": -1.0}}]}]}))
    with pytest.raises(StageError, match="has 2 entries for a 3-token prompt"):
        c.prompt_token_logprobs("ppl", "m", [1, 2, 3])


def test_prompt_logprobs_read():
    entries = [None, {"2": {"logprob": -1.5}, "8": {"logprob": -0.2}}, {"3": {"logprob": -0.25}}]
    c = _client(_json({"choices": [{"prompt_logprobs": entries}]}))
    assert c.prompt_token_logprobs("ppl", "m", [1, 2, 3])[0] == [None, -1.5, -0.25]


def test_http_500_names_stage_route_and_body():
    c = _client(_json({"error": {"message": "engine exploded"}}, status=500))
    with pytest.raises(StageError, match=r"^stage tps: HTTP 500 from POST /v1/chat/completions: .*engine exploded"):
        c.chat("tps", "m", "hi", 8)


def test_missing_usage():
    c = _client(_json({"choices": [{"message": {"content": "x"}}]}))
    with pytest.raises(StageError, match=r"stage tps: response has no usage\.prompt_tokens"):
        c.chat("tps", "m", "hi", 8)


def test_not_json():
    c = _client(lambda request: httpx.Response(200, text="<html>"))
    with pytest.raises(StageError, match="stage tps: POST /v1/chat/completions returned a body that is not JSON"):
        c.chat("tps", "m", "hi", 8)


def test_connection_refused():
    with Client(f"http://127.0.0.1:{free_port()}") as c, pytest.raises(StageError, match="stage connect: GET /v1/models failed"):
        c.model_ids()


def test_chat_payload_is_bench_servings():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        seen.update(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}],
                                         "usage": {"prompt_tokens": 3, "completion_tokens": 8}})

    reply = _client(handler).chat("tps", "m", "hello", 8)
    assert (reply.prompt_tokens, reply.completion_tokens) == (3, 8)
    assert seen == {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.0,
                    "max_tokens": 8, "stream": False, "ignore_eos": True}
