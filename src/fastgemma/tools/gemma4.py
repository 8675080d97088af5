"""Gemma 4's own tool-call format, as its chat template writes it:

    <|tool>declaration:get_weather{...}<tool|>               the template renders `tools`
    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>
    <|tool_response>response:get_weather{value:...}<tool_response|>

The markers and the string quote `<|"|>` are special tokens, so calls are found in the token
ids (text decoded without special tokens has lost them) and a call's body is decoded with
them. Values: strings between quote tokens, numbers, true / false / null, `{key:value,...}`
objects with bare keys, `[a,b]` arrays. A forced choice is a Lark grammar over the same
tokens (`<[id]>` is a token in llguidance's Lark) whose arguments follow the function's
schema: strings (maxLength), numbers, integers, booleans, null, enum / const, arrays and
objects (properties in sorted order, as the template writes them; the required ones
present); a schema that needs more (anyOf, $ref, patterns, ranges) is refused, naming the
keyword, and "auto" still works for it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastgemma.engine.structured_output import StructuredOutputsParams
from fastgemma.tools.call import ToolCall, history_arguments

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_KEY = re.compile(r"\s*([^:{}\[\],\s]+)\s*:")


def uses_gemma4_calls(chat_template: Any) -> bool:
    return isinstance(chat_template, str) and OPEN in chat_template


class Gemma4Format:
    name = "gemma4"

    def __init__(self, tokenizer: Any):
        """`tokenizer`: fastgemma's Tokenizer over a vocabulary with Gemma 4's markers."""
        self.tokenizer = tokenizer
        ids = [tokenizer.hf.convert_tokens_to_ids(t) for t in (OPEN, CLOSE, QUOTE)]
        if any(i is None or i == tokenizer.hf.unk_token_id for i in ids):
            raise ValueError(f"the chat template writes {OPEN} calls but the vocabulary lacks {OPEN}, {CLOSE} or {QUOTE}")
        self.open, self.close, self.quote = ids

    # ---- prompt --------------------------------------------------------------------------

    def prompt(self, messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None) -> tuple[list, list | None]:
        """The messages as the template takes them (arguments as objects, a tool message
        named after the call it answers) and the tools for its `tools`."""
        names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {**c, "function": {"name": c["function"]["name"], "arguments": history_arguments(c)}}
                    for c in m["tool_calls"]
                ]
            if m["role"] == "tool" and not m.get("name"):
                m["name"] = names.get(m.get("tool_call_id"), "unknown")
            out.append(m)
        return out, offered

    # ---- parsing -------------------------------------------------------------------------

    def parse(self, text: str, token_ids: list[int]) -> tuple[str | None, list[ToolCall]]:
        """(the text outside the calls, stripped, or None when empty; the calls)."""
        stream, outside, pieces = self.stream(), [], []  # outside: ids between calls, decoded whole
        for t in token_ids:
            if stream.inside is None and t != self.open:
                outside.append(t)
                continue
            pieces.append(self.tokenizer.decode(outside))
            outside = []
            pieces.append(stream.feed("", t)[0])  # a call's tokens: nothing, or its text if it is not one
        pieces += [self.tokenizer.decode(outside), stream.flush()]
        return ("".join(pieces).strip() or None) if stream.calls else text, stream.calls

    def stream(self) -> Gemma4CallStream:
        return Gemma4CallStream(self)

    def call(self, body_ids: list[int]) -> ToolCall | None:
        """The call whose body (the ids between the markers) is `call:name{...}`, or None."""
        body = self.tokenizer.decode(body_ids, skip_special_tokens=False)
        if not body.startswith("call:") or "{" not in body:
            return None
        name, brace = body[5 : body.index("{")].strip(), body.index("{")
        try:
            args, end = _value(body, brace)
        except (ValueError, IndexError):
            return None
        if not name or body[end:].strip() or not isinstance(args, dict):
            return None
        return ToolCall(name, json.dumps(args, ensure_ascii=False))

    # ---- forced choices ------------------------------------------------------------------

    def grammar(self, functions: list[dict[str, Any]], several: bool) -> StructuredOutputsParams:
        rules, options = _Rules(self.quote), []
        for f in functions:
            body = rules.object_body(f.get("parameters") or {}, "tools." + f["name"] + ".parameters")
            options.append(rules.add(f'{json.dumps(f["name"] + "{")} {body} "}}"'.replace("  ", " ")))
        options = " | ".join(options)
        lark = (
            ("start: call+\n" if several else "start: call\n")
            + f'call: <[{self.open}]> "call:" ({options}) <[{self.close}]>\n'
            + "".join(rules.lines)
        )
        return StructuredOutputsParams(grammar=lark, where="tools")


class Gemma4CallStream:
    """Token by token: text outside calls passes through; a call is given whole at its
    closing marker; a body that does not parse becomes text."""

    def __init__(self, fmt: Gemma4Format):
        self.fmt, self.calls, self.inside = fmt, [], None

    def feed(self, text: str, token_id: int | None) -> tuple[str, list[ToolCall]]:
        """(content to send now, calls completed by this token). The opening marker's own
        event carries text released from before it."""
        if token_id is None:
            return (text if self.inside is None else ""), []
        if self.inside is None:
            if token_id == self.fmt.open:
                self.inside = []
            return text, []
        if token_id != self.fmt.close:
            self.inside.append(token_id)
            return "", []
        body, self.inside = self.inside, None
        call = self.fmt.call(body)
        if call is None:
            return self.fmt.tokenizer.decode([self.fmt.open, *body, self.fmt.close], skip_special_tokens=False), []
        self.calls.append(call)
        return "", [call]

    def flush(self) -> str:
        """An unfinished call, as text."""
        if self.inside is None:
            return ""
        body, self.inside = self.inside, None
        return self.fmt.tokenizer.decode([self.fmt.open, *body], skip_special_tokens=False)


def _value(s: str, i: int) -> tuple[Any, int]:
    """The value starting at s[i] (spaces skipped) and the index after it; ValueError if none."""
    i = _skip(s, i)
    if s.startswith(QUOTE, i):
        end = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE) : end], end + len(QUOTE)
    if s[i] == "{":
        pairs, i = _items(s, i + 1, "}", _pair)
        return dict(pairs), i
    if s[i] == "[":
        return _items(s, i + 1, "]", _value)
    literal = _NUMBER.match(s, i)
    if literal is None:
        raise ValueError(f"no value at {i}")
    return json.loads(literal.group(0)), literal.end()


def _pair(s: str, i: int) -> tuple[tuple[str, Any], int]:
    key = _KEY.match(s, i)
    if key is None:
        raise ValueError(f"no key at {i}")
    value, i = _value(s, key.end())
    return (key.group(1), value), i


def _items(s: str, i: int, close: str, item: Any) -> tuple[list[Any], int]:
    """Comma-separated `item`s from s[i] up to `close`; (the items, the index after `close`)."""
    out = []
    while (i := _skip(s, i)) < len(s) and s[i] != close:
        value, i = item(s, i)
        out.append(value)
        i = _skip(s, i)
        if s[i] == ",":
            i += 1
        elif s[i] != close:
            raise ValueError(f"expected , or {close} at {i}")
    return out, i + 1


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


_KEYWORDS = {"type", "properties", "required", "items", "enum", "const", "maxLength", "description", "title",
             "additionalProperties", "default", "examples"}


class _Rules:
    """Lark rules of Gemma 4 values that follow a JSON schema (the supported subset)."""

    def __init__(self, quote: int):
        self.quote, self.lines = quote, []

    def add(self, body: str) -> str:
        name = f"r{len(self.lines)}"
        self.lines.append(f"{name}: {body}\n")
        return name

    def value(self, schema: Any, where: str) -> str:
        if schema is True or schema == {}:
            raise ValueError(f"{where}: Gemma 4's call grammar needs a type for every value; use tool_choice auto")
        if not isinstance(schema, dict):
            raise ValueError(f"{where}: not a JSON schema")
        if unsupported := sorted(set(schema) - _KEYWORDS):
            raise ValueError(f"{where}: Gemma 4's call grammar does not support {unsupported[0]!r}; use tool_choice auto")
        q = f"<[{self.quote}]>"
        choices = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
        if choices is not None:
            return self.add(" | ".join(f"{q} {json.dumps(c)} {q}" if isinstance(c, str) else json.dumps(json.dumps(c))
                                       for c in choices))
        kind = schema.get("type")
        if kind == "string":
            n = schema.get("maxLength")
            return self.add(f"{q} /(?s:.{{0,{int(n)}}})/ {q}" if n is not None else f"{q} /(?s:.*)/ {q}")
        if kind == "integer":
            return self.add("/-?(0|[1-9][0-9]*)/")
        if kind == "number":
            return self.add(r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/")
        if kind == "boolean":
            return self.add('"true" | "false"')
        if kind == "null":
            return self.add('"null"')
        if kind == "array":
            item = self.value(schema.get("items", {}), f"{where}.items")
            return self.add(f'"[" ({item} ("," {item})*)? "]"')
        if kind == "object":
            return self.add(f'"{{" {self.object_body(schema, where)} "}}"'.replace("  ", " "))
        raise ValueError(f"{where}: Gemma 4's call grammar does not support type {kind!r}; use tool_choice auto")

    def object_body(self, schema: dict[str, Any], where: str) -> str:
        """`key:value` pairs in sorted key order, the required ones present, comma-separated."""
        if unsupported := sorted(set(schema) - _KEYWORDS):
            raise ValueError(f"{where}: Gemma 4's call grammar does not support {unsupported[0]!r}; use tool_choice auto")
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        pairs = [(f'"{k}:" {self.value(props[k], f"{where}.{k}")}', k in required) for k in sorted(props)]
        # first: the pairs from i on, none written yet; rest: the same after one was (a comma first)
        first = rest = None  # nothing left
        for pair, needed in reversed(pairs):
            tail = f" {rest}" if rest else ""
            if needed:
                first, rest = self.add(f"{pair}{tail}"), self.add(f'"," {pair}{tail}')
            else:
                first = self.add(f"{pair}{tail} | {first}" if first else f"({pair}{tail})?")
                rest = self.add(f'("," {pair})?{tail}')
        return first or ""
