"""The Hermes tool-call format: fastgemma's default, for chat templates without a format of
their own (Gemma 3's, the embedded base model's fallback). vLLM's `hermes` parser and Qwen's
templates use it. The tools are listed in a system message:

    # Tools
    You may call one or more functions ... within <tools></tools> XML tags:
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>
    For each function call, return a json object with function name and arguments within
    <tool_call></tool_call> XML tags: ...

and the model answers with calls such as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

An assistant message's `tool_calls` are written back in that form, and `tool` messages become
user turns holding `<tool_response>...</tool_response>` (Gemma's turns are user and model).
Calls are found in the text (plain characters); a forced choice is a Lark grammar whose
`arguments` follow each function's JSON schema.
"""

from __future__ import annotations

import json
from typing import Any

from fastgemma.engine.structured_output import StructuredOutputsParams
from fastgemma.tools.call import ToolCall, history_arguments, text_of

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

SYSTEM_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)



def prompt_messages(messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The messages for the chat template: the `offered` tools (OpenAI's tool objects, or
    None) in the system message, tool-call history written as text."""
    out: list[dict[str, Any]] = []
    if offered:  # into the conversation's system message (first), or one of its own
        listing = SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in offered))
        if messages and messages[0]["role"] == "system":
            first, messages = messages[0], messages[1:]
            listing = f"{text_of(first.get('content'))}\n\n{listing}"
        out.append({"role": "system", "content": listing})
    for m in messages:
        if m["role"] == "tool":
            text = f"<tool_response>\n{text_of(m.get('content'))}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool_response"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text, "_tool_response": True})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                f"{CALL_OPEN}\n"
                + json.dumps({"name": c["function"]["name"], "arguments": history_arguments(c)}, ensure_ascii=False)
                + f"\n{CALL_CLOSE}"
                for c in m["tool_calls"]
            )
            text = text_of(m.get("content"))
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    return [{k: v for k, v in m.items() if k != "_tool_response"} for m in out]


def call_grammar(functions: list[dict[str, Any]], several: bool) -> StructuredOutputsParams:
    """The grammar of a forced choice among `functions` (OpenAI's `function` objects): one
    call, or (`several`) one or more separated by newlines, each `arguments` following its
    function's parameters schema."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = {**(options[0] if len(options) == 1 else {"anyOf": options}), "x-guidance": _JSON_STYLE}
    lark = (
        ('start: call ("\\n" call)*\n' if several else "start: call\n")
        + f"call: {json.dumps(CALL_OPEN + chr(10))} body {json.dumps(chr(10) + CALL_CLOSE)}\n"
        + f"body: %json {json.dumps(schema)}\n"
    )
    return StructuredOutputsParams(grammar=lark, where="tools")


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """(the text outside the calls, stripped, or None when empty; the calls). A block that is
    not a JSON object with a name stays in the text; so does text between and after calls,
    unless it is only whitespace."""
    content, calls = _scan(text, final=True)
    return (content.strip() or None) if calls else text, calls


def _scan(text: str, final: bool) -> tuple[str, list[ToolCall]]:
    """(content, calls) of `text`. Not `final` (streaming): leave out what later text may
    still change: a trailing prefix of CALL_OPEN, an unclosed call, and whitespace after a
    call (dropped if another call follows), so that each result's content is a prefix of
    the next one's."""
    content, calls, segment, pos = [], [], "", 0

    def close_segment(seg: str) -> None:
        if not calls or seg.strip():  # whitespace between / after calls is dropped
            content.append(seg)

    while (start := text.find(CALL_OPEN, pos)) >= 0:
        end = text.find(CALL_CLOSE, start)
        if end < 0:
            break
        call = _call(text[start + len(CALL_OPEN) : end])
        if call is None:
            segment += text[pos : end + len(CALL_CLOSE)]
        else:
            close_segment(segment + text[pos:start])
            segment = ""
            calls.append(call)
        pos = end + len(CALL_CLOSE)
    tail = text[pos:]
    if not final:
        unclosed = tail.find(CALL_OPEN)
        tail = tail[:unclosed] if unclosed >= 0 else tail[: len(tail) - _partial_open(tail)]
        if calls and not (segment + tail).strip():
            return "".join(content), calls  # whitespace after a call: not yet known to stay
    close_segment(segment + tail)
    return "".join(content), calls


def _call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallStream:
    """Streamed text as content deltas and whole tool calls, agreeing with
    `parse_tool_calls` on the whole text: text that could still belong to a call is held
    back until it cannot; a call is given when its closing tag arrives (its arguments in one
    delta, which OpenAI's clients accumulate as any)."""

    def __init__(self) -> None:
        self.text, self.sent = "", ""
        self.calls: list[ToolCall] = []

    def feed(self, text: str, token_id: int | None = None) -> tuple[str, list[ToolCall]]:
        """(content to send now, calls completed by this text); `token_id` is not needed."""
        self.text += text
        return self._advance(final=False)

    def flush(self) -> str:
        """What is still held back, at the end (an unfinished call stays text)."""
        return self._advance(final=True)[0]

    def _advance(self, final: bool) -> tuple[str, list[ToolCall]]:
        content, calls = _scan(self.text, final)
        new = calls[len(self.calls) :]
        self.calls += new
        delta, self.sent = content[len(self.sent) :], content
        return delta, new


def _partial_open(text: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of CALL_OPEN."""
    for n in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-n:]):
            return n
    return 0


class HermesFormat:
    """The Hermes format behind the interface every format has (tools/__init__.py)."""

    name = "hermes"

    def prompt(self, messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None) -> tuple[list, None]:
        return prompt_messages(messages, offered), None

    def grammar(self, functions: list[dict[str, Any]], several: bool) -> StructuredOutputsParams:
        return call_grammar(functions, several)

    def parse(self, text: str, token_ids: list[int]) -> tuple[str | None, list[ToolCall]]:
        return parse_tool_calls(text)

    def stream(self) -> ToolCallStream:
        return ToolCallStream()
