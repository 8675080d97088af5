"""Structured outputs and tool calls through the server, with the official `openai` client,
on the embedded Gemma 3 270M (bf16, lm_head screen on: the default engine).

Greedy constrained tokens are compared with the plain path's masked argmax
(tests/engine/test_structured_output.py's reference) for several schemas; the rest checks
what a client sees: parsed objects validate, JSON parses, regex / choice match, required and
named tool calls carry arguments that follow the function's schema, streamed and not, and
every bad constraint is a 400 naming its field while the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest
from pydantic import BaseModel, Field
from tests.engine.test_structured_output import masked_greedy_reference

from fastgemma import LLM, StructuredOutputsParams
from fastgemma.config import EngineConfig
from fastgemma.server import ServerThread

openai = pytest.importorskip("openai")

MODEL = "gemma"
SHOTS = 'Q: Paris\nA: {"city": "Paris", "country": "France"}\nQ: Berlin\nA: {"city": "Berlin", "country": "Germany"}\nQ: %s\nA:'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                                                    "required": ["zone"], "additionalProperties": False}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=24)


@pytest.fixture(scope="module")
def served():
    llm = LLM(max_model_len=1024, max_num_seqs=4)
    with ServerThread(llm, served_model_name=MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def oai(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_parse_returns_an_object_that_validates(oai):
    r = oai.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person: name, age and city."}],
        response_format=Person, max_tokens=100, temperature=0,
    )
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and r.choices[0].finish_reason == "stop"
    Person.model_validate_json(r.choices[0].message.content)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_object_output_parses(oai, temperature):
    for city in ("Rome", "Madrid", "Tokyo", "Lisbon"):
        r = oai.completions.create(model=MODEL, prompt=SHOTS % city, max_tokens=60, temperature=temperature, seed=1,
                                   extra_body={"response_format": {"type": "json_object"}})
        assert r.choices[0].finish_reason == "stop", r.choices[0].text
        assert isinstance(json.loads(r.choices[0].text), dict)


def test_regex_and_choice_outputs_match(oai):
    pattern = r"\d{3}-\d{3}-\d{4}"
    for temperature in (0.0, 1.0):
        r = oai.completions.create(model=MODEL, prompt="My phone number is", max_tokens=30, temperature=temperature,
                                   seed=2, extra_body={"structured_outputs": {"regex": pattern}})
        assert re.fullmatch(pattern, r.choices[0].text) and r.choices[0].finish_reason == "stop"
        r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is Paris in France?"}],
                                        max_tokens=10, temperature=temperature, seed=2,
                                        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
        assert r.choices[0].message.content in ("yes", "no", "maybe")
    chunks = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Call me at"}],
                                         max_tokens=30, temperature=0, stream=True,
                                         extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices))


def _valid_weather(arguments: str) -> bool:
    args = json.loads(arguments)
    return (set(args) == {"city", "unit"} and isinstance(args["city"], str) and len(args["city"]) <= 30
            and args["unit"] in ("celsius", "fahrenheit"))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_validate_streamed_and_not(oai, choice):
    kwargs = dict(model=MODEL, messages=ASK, tools=[TIME, WEATHER], tool_choice=choice, max_tokens=120, temperature=0)
    r = oai.chat.completions.create(**kwargs)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for call in calls:
        assert call.type == "function" and call.id
        if call.function.name == "get_weather":
            assert _valid_weather(call.function.arguments)
        else:
            assert call.function.name == "get_time" and set(json.loads(call.function.arguments)) == {"zone"}
    if isinstance(choice, dict):
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
    streamed: dict[int, dict] = {}
    finish = None
    for chunk in oai.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = streamed.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(streamed.items())] == [
        (c.function.name, c.function.arguments) for c in calls
    ]


def test_a_tool_conversation_round_trips(oai, served):
    """An assistant's tool_calls and the tool's answer go back into the prompt; the next turn runs."""
    first = oai.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=60, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    assert len(first.choices[0].message.tool_calls) == 1
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    r = oai.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=8, temperature=0,
                                    extra_body={"return_token_ids": True})
    prompt = served.state.llm.tokenizer.decode(r.prompt_token_ids, skip_special_tokens=False)
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {call.function.arguments}}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in prompt
    assert prompt.index("<tool_call>") < prompt.index("<tool_response>") and r.choices[0].finish_reason


def test_constrained_greedy_equals_the_plain_masked_argmax(served):
    """Served tokens (screen on) = the plain path's masked argmax (full lm_head), step by step."""
    plain = LLM.from_config(EngineConfig(max_model_len=1024).plain())
    grammars = served.state.llm.engine.grammars
    cases = [
        ({"json": Person.model_json_schema()}, StructuredOutputsParams(json=Person.model_json_schema())),
        ({"json_object": True}, StructuredOutputsParams(json_object=True)),
        ({"regex": r"[A-Z][a-z]+, [0-9]{2}"}, StructuredOutputsParams(regex=r"[A-Z][a-z]+, [0-9]{2}")),
        ({"choice": ["red", "green", "blue"]}, StructuredOutputsParams(choice=["red", "green", "blue"])),
    ]
    with httpx.Client(base_url=served.url, timeout=300) as client:
        for prompt in ("A person:", SHOTS % "Oslo"):
            ids = plain.encode_prompt(prompt)
            for field, params in cases:
                body = {"prompt": ids, "max_tokens": 48, "temperature": 0, "return_token_ids": True,
                        "structured_outputs": field}
                got = client.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]
                assert got == masked_greedy_reference(plain, grammars, ids, params, 48), (prompt, field)


BAD = [
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": {"type": "frobnicate"}}}, "structured_outputs.json"),
    ({"structured_outputs": {"grammar": "start: missing"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"pattern": "a"}}, "structured_outputs.pattern"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    ({"logit_bias": {"five": 3}}, "logit_bias"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"n": 1000}, "n"),
]


@pytest.mark.parametrize("extra,param", BAD, ids=[p for _, p in BAD])
def test_bad_constraints_are_a_400_naming_the_field(served, extra, param):
    with httpx.Client(base_url=served.url, timeout=60) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
        ok = client.post("/v1/chat/completions", json={"model": MODEL, "messages": body["messages"], "max_tokens": 2})
        assert ok.status_code == 200


def test_unknown_fields_are_ignored_with_one_warning(served, caplog):
    with caplog.at_level(logging.WARNING, logger="fastgemma.server"), httpx.Client(base_url=served.url) as client:
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "frobnicate": 1, "metadata": {"a": "b"}})
    assert r.status_code == 200
    warned = [rec.getMessage() for rec in caplog.records if "ignoring" in rec.getMessage()]
    assert len(warned) == 1 and "frobnicate" in warned[0] and "metadata" not in warned[0]


def test_each_of_n_choices_follows_the_schema_and_is_its_seeds_request(oai):
    """n = 3 sampled choices of one constrained prompt: each has its own grammar state and is
    the request with seed + i alone."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Describe a person: name, age and city."}],
              response_format=Person, max_tokens=100, temperature=1.0)
    r = oai.chat.completions.parse(n=3, seed=21, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for i, choice in enumerate(r.choices):
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)
        assert oai.chat.completions.parse(seed=21 + i, **kw).choices[0].message.content == choice.message.content
    assert len({c.message.content for c in r.choices}) > 1


def test_n_choices_of_a_forced_tool_call_stream_each_their_own_calls(oai):
    """Each choice's calls are parsed out of its own text, streamed under its index."""
    kwargs = dict(model=MODEL, messages=ASK, tools=[TIME, WEATHER], tool_choice="required", max_tokens=120,
                  temperature=1.0, seed=8, n=2)
    whole = oai.chat.completions.create(**kwargs)
    streamed: dict[int, dict[int, dict]] = {0: {}, 1: {}}
    finish: dict[int, str] = {}
    for chunk in oai.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = streamed[choice.index].setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls"
        assert [(c["name"], c["arguments"]) for _, c in sorted(streamed[choice.index].items())] == [
            (c.function.name, c.function.arguments) for c in choice.message.tool_calls]
