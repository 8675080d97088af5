"""The OpenAPI document describes the API (request bodies, responses), and a fuzzer driven by
it finds no server error: schemathesis generates bodies from the declared request models
(valid and invalid ones) against the tiny served model, as vLLM's own test suite does
(tests/entrypoints/openai/test_openai_schema.py). `max_tokens` is capped so that every
generation is short; everything else is left to the fuzzer."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings

MAX_TOKENS = 4


def test_the_document_declares_bodies_and_responses(client):
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, model, response in (("/v1/completions", "CompletionRequest", "CompletionResponse"),
                                  ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletionResponse")):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + model)
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + response)
        assert "text/event-stream" in op["responses"]["200"]["content"]
    assert "prompt" in schemas["CompletionRequest"]["properties"] and "messages" in schemas["ChatCompletionRequest"]["required"]
    refs = _refs(doc)
    assert refs and all(r.removeprefix("#/components/schemas/") in schemas for r in refs)


def _refs(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _cap(case) -> None:
    if isinstance(case.body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                case.body[field] = min(value, MAX_TOKENS)
        if case.body.get("max_tokens") is None and case.body.get("max_completion_tokens") is None:
            case.body["max_tokens"] = MAX_TOKENS


def test_no_input_makes_a_server_error(server):
    """Every operation of /openapi.json, up to 100 generated cases each (schemathesis drives
    hypothesis directly: its pytest plugin does not load under pytest 9)."""
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    seen: list[int] = []
    for op in operations:

        @given(case=op.as_strategy())
        @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def fuzz(case) -> None:
            _cap(case)
            response = case.call(base_url=server.url, timeout=60)
            seen.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])

        fuzz()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert len(seen) >= 3 * 20  # the fuzzer ran
    assert any(200 <= s < 300 for s in seen) and any(400 <= s < 500 for s in seen)  # both kinds were tried
