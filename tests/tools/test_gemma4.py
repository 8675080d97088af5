"""fastgemma/tools/gemma4.py on the tiny Gemma 4 (its test tokenizer carries Gemma 4's tool
markers as special tokens, its template the tool syntax): prompts, parsing from token ids
(whole and streamed), and forced calls whose arguments follow the schema."""

from __future__ import annotations

import json

import pytest

from fastgemma import SamplingParams
from fastgemma.engine.structured_output import GrammarCompiler
from fastgemma.tokenizer import Tokenizer
from fastgemma.tools import forced_grammar, tool_format
from fastgemma.tools.gemma4 import Gemma4Format
from fastgemma.tools.hermes import HermesFormat

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]},
                   "days": {"type": "integer"}, "hourly": {"type": "boolean"}},
    "required": ["city", "unit"], "additionalProperties": False}}}
CALL = ('<|tool_call>call:get_weather{city:<|"|>Paris, TX<|"|>,days:3,opts:{metric:true,level:-1.5e2},'
        'tags:[<|"|>a<|"|>,<|"|>b:c<|"|>]}<tool_call|>')
ARGS = {"city": "Paris, TX", "days": 3, "opts": {"metric": True, "level": -150.0}, "tags": ["a", "b:c"]}


@pytest.fixture(scope="module")
def fmt(tiny_multimodal) -> Gemma4Format:
    found = tool_format(Tokenizer.from_folder(tiny_multimodal))
    assert isinstance(found, Gemma4Format)
    return found


def test_the_format_follows_the_template(fmt, tiny_text_model):
    assert isinstance(tool_format(Tokenizer.from_folder(tiny_text_model)), HermesFormat)  # Gemma 3's / fallback
    assert isinstance(tool_format(Tokenizer(None)), HermesFormat)


def test_calls_are_parsed_from_the_token_ids(fmt):
    tok = fmt.tokenizer
    ids = tok.encode("Let me look." + CALL + CALL.replace("Paris, TX", "Oslo"), add_special_tokens=False)
    assert fmt.open in ids and fmt.close in ids and fmt.quote in ids  # the markers are single tokens
    text = tok.decode(ids)  # what the server's text holds: special tokens skipped
    content, calls = fmt.parse(text, ids)
    assert content == "Let me look."
    assert [json.loads(c.arguments) for c in calls] == [ARGS, {**ARGS, "city": "Oslo"}]
    assert all(c.name == "get_weather" for c in calls)
    stream, streamed, got = fmt.stream(), "", []
    for t in ids:  # token by token, as the engine emits them
        delta, new = stream.feed(tok.decode([t]), t)
        streamed += delta
        got += new
    streamed += stream.flush()
    assert streamed.strip() == content and [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in calls]
    broken = tok.encode("x<|tool_call>call:get_weather{city:<tool_call|>", add_special_tokens=False)
    assert fmt.parse(tok.decode(broken), broken) == (tok.decode(broken), [])  # not a call: the text stays
    assert fmt.parse("plain", tok.encode("plain", add_special_tokens=False)) == ("plain", [])


def test_the_template_renders_tools_and_history(fmt):
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]
    rendered, tools = fmt.prompt(messages, [WEATHER])
    assert tools == [WEATHER]
    text = fmt.tokenizer.apply_chat_template(rendered, tools=tools)
    assert "<|tool>declaration:get_weather<tool|>" in text
    assert '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:2}<tool_call|>' in text
    assert '<|tool_response>response:get_weather{value:<|"|>cold<|"|>}<tool_response|>' in text


def test_forced_grammar_accepts_the_schema_and_nothing_else(fmt):
    compiler = GrammarCompiler(fmt.tokenizer.hf, 262144, (1, 106))
    tok = fmt.tokenizer

    def accepted(text: str, choice="required", parallel=True) -> bool:
        ids = tok.encode(text, add_special_tokens=False)
        matcher = compiler.compile(forced_grammar(fmt, [WEATHER], choice, parallel)).matcher
        return matcher.validate_tokens(ids) == len(ids)

    good = '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,unit:<|"|>c<|"|>}<tool_call|>'
    assert accepted(good) and accepted(good + good)
    one = compiler.compile(forced_grammar(fmt, [WEATHER], "required", False)).matcher  # parallel calls off
    ids = tok.encode(good + good, add_special_tokens=False)
    assert one.validate_tokens(ids) == len(tok.encode(good, add_special_tokens=False))
    full = '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:4,hourly:true,unit:<|"|>f<|"|>}<tool_call|>'
    assert accepted(full)  # every property, in sorted order
    assert not accepted('<|tool_call>call:get_weather{unit:<|"|>c<|"|>}<tool_call|>')  # city is required
    assert not accepted('<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,unit:<|"|>k<|"|>}<tool_call|>')  # enum
    assert not accepted('<|tool_call>call:get_weather{city:<|"|>' + "x" * 21 + '<|"|>,unit:<|"|>c<|"|>}')  # maxLength
    assert not accepted('<|tool_call>call:get_time{}<tool_call|>')
    with pytest.raises(ValueError, match="anyOf"):
        forced_grammar(fmt, [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}}}}], "required", True)


def test_a_forced_call_from_the_model_parses_and_validates(fmt, mm_llm):
    """The tiny random Gemma 4 under the forced grammar: its call parses into arguments that
    follow the schema (the engine path the server takes)."""
    llm = mm_llm
    assert isinstance(llm.tool_format, Gemma4Format)
    params = SamplingParams(max_tokens=80, temperature=1.0, seed=3,
                            structured_outputs=forced_grammar(llm.tool_format, [WEATHER], "required", False))
    out = llm.chat([{"role": "user", "content": "Weather in Oslo?"}], params, tools=[WEATHER]).outputs[0]
    content, calls = llm.tool_format.parse(out.text, out.token_ids)
    assert out.finish_reason == "stop" and len(calls) == 1, (out.text, out.token_ids)
    args = json.loads(calls[0].arguments)
    assert {"city", "unit"} <= set(args) <= {"city", "unit", "days", "hourly"}
    assert isinstance(args["city"], str) and len(args["city"]) <= 20 and args["unit"] in ("c", "f")
