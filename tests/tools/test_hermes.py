"""fastgemma/tools/hermes.py: tools into the prompt, calls out of the text (whole and streamed)."""

from __future__ import annotations

import json
import random

import pytest

from fastgemma.tools import forced_grammar, offered_tools
from fastgemma.tools.hermes import CALL_CLOSE, CALL_OPEN, HermesFormat, ToolCallStream, parse_tool_calls, prompt_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def _call(name: str, args: dict) -> str:
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{CALL_CLOSE}"


TEXT = "Let me check. " + _call("get_weather", {"city": "Paris"}) + "\n" + _call("get_time", {}) + " done"


def test_calls_are_parsed_out_of_the_text():
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check.  done"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c.id for c in calls}) == 2
    assert parse_tool_calls("no calls here") == ("no calls here", [])
    broken = f"{CALL_OPEN}not json{CALL_CLOSE}"
    assert parse_tool_calls(broken) == (broken, [])
    assert parse_tool_calls(_call("f", {}))[0] is None  # only a call: no content


@pytest.mark.parametrize("seed", range(5))
def test_streamed_calls_are_the_whole_texts_calls_at_any_chunking(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 12))
    pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)])]
    stream, content, calls = ToolCallStream(), "", []
    for piece in pieces:
        text, new = stream.feed(piece)
        assert CALL_OPEN not in text and "<tool" not in text  # a call's text never leaks as content
        content += text
        calls += new
    content += stream.flush()
    want_content, want_calls = parse_tool_calls(TEXT)
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want_calls]
    assert content.strip() == want_content


def test_plain_text_streams_through_and_a_dangling_tag_is_flushed():
    stream = ToolCallStream()
    assert stream.feed("Hello <to") == ("Hello ", [])
    assert stream.feed("day") == ("<today", [])
    assert stream.feed(f" {CALL_OPEN}" + '{"name": "x"') == (" ", [])
    assert stream.flush() == f"{CALL_OPEN}" + '{"name": "x"'


def test_tools_go_into_the_system_message_and_history_into_turns():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
        {"role": "tool", "tool_call_id": "c2", "content": "windy"},
    ]
    out = prompt_messages(messages, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and '"get_weather"' in out[0]["content"]
    assert out[2]["content"] == _call("get_weather", {"city": "Oslo"})
    assert out[3]["content"] == "<tool_response>\ncold\n</tool_response>\n<tool_response>\nwindy\n</tool_response>"
    assert all(set(m) == {"role", "content"} for m in out)
    assert offered_tools([WEATHER], "none") is None and offered_tools([WEATHER], "auto") == [WEATHER]
    assert prompt_messages(messages[1:2], None) == messages[1:2]


def test_forced_choices_are_grammars_over_the_named_functions():
    fmt = HermesFormat()
    assert forced_grammar(fmt, [WEATHER], "auto", True) is None and forced_grammar(fmt, [WEATHER], "none", True) is None
    named = forced_grammar(fmt, [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, True)
    assert "get_time" in named.grammar and "get_weather" not in named.grammar and "start: call\n" in named.grammar
    several = forced_grammar(fmt, [WEATHER, TIME], "required", True)
    assert "get_time" in several.grammar and "get_weather" in several.grammar and '("\\n" call)*' in several.grammar
    one = forced_grammar(fmt, [WEATHER, TIME], "required", False)
    assert "start: call\n" in one.grammar


def test_forced_grammar_accepts_a_valid_call_and_rejects_bad_arguments(tiny_text_model):
    """Compiled against the real Gemma vocabulary: the call text is accepted token by token;
    arguments that break the schema are not."""
    from transformers import AutoTokenizer

    from fastgemma.engine.structured_output import GrammarCompiler

    hf = AutoTokenizer.from_pretrained(tiny_text_model)
    compiler = GrammarCompiler(hf, 262144, (1, 106))
    params = forced_grammar(HermesFormat(), [WEATHER], "required", False)
    good = hf.encode(f'{CALL_OPEN}\n{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}\n{CALL_CLOSE}',
                     add_special_tokens=False)
    bad = hf.encode(f'{CALL_OPEN}\n{{"name": "get_weather", "arguments": {{"town": "Oslo"}}}}', add_special_tokens=False)
    assert compiler.compile(params).matcher.validate_tokens(good) == len(good)
    assert compiler.compile(params).matcher.validate_tokens(bad) < len(bad)
