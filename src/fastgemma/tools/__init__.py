"""Tool calling: how a request's tools reach the prompt, and how calls come back out.

One format per model, chosen from its chat template (`tool_format`):
- Gemma 4's own (tools/gemma4.py) when the template writes `<|tool_call>` calls: the
  template renders the tools, calls are special-token delimited and found in the token ids;
- the Hermes format (tools/hermes.py) otherwise, fastgemma's documented default: the tools
  in a system message, calls as `<tool_call>` JSON blocks in the text.

A format has `prompt(messages, offered) -> (messages, tools for the template or None)`,
`grammar(functions, several)`, `parse(text, token_ids) -> (content or None, calls)` and
`stream()` (`feed(text, token_id) -> (content, new calls)`, `flush()`); streamed and whole
parsing agree.

tool_choice (OpenAI's): "none" leaves the tools out of the prompt; "auto" (the default with
tools) lets the model choose and parses its calls; "required" and a named function are
enforced with a grammar (engine/structured_output.py) in which each call's arguments follow
that function's JSON schema, so they always validate; with `parallel_tool_calls: false`, or
a named function, exactly one call.
"""

from __future__ import annotations

from typing import Any

from fastgemma.engine.structured_output import StructuredOutputsParams
from fastgemma.tools.call import ToolCall, forced_functions
from fastgemma.tools.gemma4 import Gemma4Format, uses_gemma4_calls
from fastgemma.tools.hermes import HermesFormat

ToolFormat = HermesFormat | Gemma4Format

__all__ = ["ToolCall", "ToolFormat", "forced_grammar", "offered_tools", "tool_format"]


def tool_format(tokenizer: Any) -> ToolFormat:
    """The format of a model's tokenizer (fastgemma's Tokenizer)."""
    hf = tokenizer.hf
    if hf is not None and tokenizer.has_chat_template and uses_gemma4_calls(getattr(hf, "chat_template", None)):
        return Gemma4Format(tokenizer)
    return HermesFormat()


def offered_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools the prompt offers: none under tool_choice "none"."""
    return tools if tools and tool_choice != "none" else None


def forced_grammar(
    fmt: ToolFormat, tools: list[dict[str, Any]], tool_choice: Any, parallel: bool
) -> StructuredOutputsParams | None:
    """The grammar of "required" or a named function (None for "auto" / "none"); ValueError
    naming the schema part a format cannot enforce."""
    functions = forced_functions(tools, tool_choice)
    if functions is None:
        return None
    return fmt.grammar(functions, several=parallel and not isinstance(tool_choice, dict))
