"""What every tool-call format shares: a parsed call, the functions a tool_choice allows,
and the arguments of a call in a conversation's history."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")


def forced_functions(tools: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]] | None:
    """The `function` objects a forced choice allows ("required": all; a named one: it), or
    None when nothing is forced ("auto", "none")."""
    if tool_choice in (None, "auto", "none"):
        return None
    named = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
    return [t["function"] for t in tools if named is None or t["function"]["name"] == named]


def history_arguments(call: dict[str, Any]) -> Any:
    """An earlier call's arguments as a value (OpenAI sends them as JSON text)."""
    raw = call["function"].get("arguments", "{}")
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw


def text_of(content: Any) -> str:
    """A message's content as text (the text parts of a list joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
