"""A battery of client mistakes: each one is an OpenAI-style error (never a 500), then a good request."""

from __future__ import annotations

import pytest

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]

BAD = [
    # (id, path, body (dict, or raw str), status, param or None when not checked)
    ("invalid-json", C, '{"prompt": "x",', 400, None),
    ("not-an-object", C, "[1, 2, 3]", 400, None),
    ("empty-body", C, "", 400, None),
    ("missing-prompt", C, {"max_tokens": 2}, 400, "prompt"),
    ("prompt-int", C, {"prompt": 5}, 400, "prompt"),
    ("prompt-floats", C, {"prompt": [1.5, 2.0]}, 400, "prompt"),
    ("prompt-bools", C, {"prompt": [True, False]}, 400, "prompt"),
    ("prompt-mixed", C, {"prompt": [1, "a"]}, 400, "prompt"),
    ("empty-string", C, {"prompt": ""}, 400, "prompt"),
    ("empty-ids", C, {"prompt": []}, 400, "prompt"),
    ("empty-in-batch", C, {"prompt": ["ok", ""]}, 400, "prompt"),
    ("id-over-vocab", C, {"prompt": [2, 262144]}, 400, "prompt"),
    ("id-negative", C, {"prompt": [2, -1]}, 400, "prompt"),
    ("max-tokens-negative", C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("max-tokens-string", C, {"prompt": "x", "max_tokens": "10"}, 400, "max_tokens"),
    ("max-tokens-float", C, {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ("max-tokens-absurd", C, {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens"),
    ("over-context", C, {"prompt": list(range(10, 1010)), "max_tokens": 100}, 400, "max_tokens"),
    ("prompt-over-context", C, {"prompt": list(range(10, 1100)), "max_tokens": 1}, 400, "prompt"),
    ("temperature-negative", C, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("temperature-absurd", C, {"prompt": "x", "temperature": 1e30}, 400, "temperature"),
    ("top-p-zero", C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("top-p-over-one", C, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("top-k-negative", C, {"prompt": "x", "top_k": -7}, 400, "top_k"),
    ("logprobs-absurd", C, {"prompt": "x", "logprobs": 1000}, 400, "logprobs"),
    ("prompt-logprobs-negative", C, {"prompt": "x", "prompt_logprobs": -2}, 400, "prompt_logprobs"),
    ("n-zero", C, {"prompt": "x", "n": 0}, 400, "n"),
    ("n-over-max-num-seqs", C, {"prompt": "x", "n": 9}, 400, "n"),  # the server runs 8 sequences
    ("seed-huge", C, {"prompt": "x", "seed": 2**70}, 400, "seed"),
    ("stop-empty", C, {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("stop-int", C, {"prompt": "x", "stop": 3}, 400, "stop"),
    ("stream-string", C, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("stop-token-outside-vocab", C, {"prompt": "x", "stop_token_ids": [10**9]}, 400, "stop_token_ids"),
    ("penalty-out-of-range", C, {"prompt": "x", "presence_penalty": 2.5}, 400, None),
    ("repetition-penalty-zero", C, {"prompt": "x", "repetition_penalty": 0}, 400, None),
    ("logit-bias-key", C, {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit-bias-vocab", C, {"prompt": "x", "logit_bias": {"999999999": 1}}, 400, "logit_bias"),
    ("logit-bias-range", C, {"prompt": "x", "logit_bias": {"5": 101}}, 400, None),
    ("unknown-model", C, {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("chat-missing-messages", CHAT, {"max_tokens": 2}, 400, "messages"),
    ("chat-empty-messages", CHAT, {"messages": []}, 400, "messages"),
    ("chat-messages-string", CHAT, {"messages": "hi"}, 400, "messages"),
    ("chat-bad-role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("chat-content-int", CHAT, {"messages": [{"role": "user", "content": 42}]}, 400, None),
    ("chat-image-part", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None),
    ("chat-max-tokens-zero", CHAT, {"messages": OK_MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("chat-over-context", CHAT, {"messages": OK_MSG, "max_completion_tokens": 5000}, 400, "max_tokens"),
    ("chat-top-logprobs-alone", CHAT, {"messages": OK_MSG, "top_logprobs": 3}, 400, "top_logprobs"),
    ("chat-unknown-model", CHAT, {"model": "nope", "messages": OK_MSG}, 404, "model"),
]


@pytest.mark.parametrize("path,body,status,param", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_is_an_openai_error(client, path, body, status, param):
    if isinstance(body, str):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
    if param is not None:
        assert err["param"] == param


def test_unknown_route_and_wrong_method_are_json_errors(client):
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405


def test_server_keeps_serving_after_the_battery(client, helpers):
    for _, path, body, status, _ in BAD:
        r = client.post(path, json=body) if not isinstance(body, str) else client.post(path, content=body)
        assert r.status_code == status
    r = client.post(C, json={"prompt": "Still alive?", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    r = client.post(CHAT, json={"messages": OK_MSG, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    assert helpers.metric(client, "fastgemma:requests_total", endpoint=C, status="500") == 0
    assert helpers.metric(client, "fastgemma:requests_total", endpoint=CHAT, status="500") == 0
    assert helpers.metric(client, "fastgemma:requests_total", endpoint=C, status="400") >= 30
