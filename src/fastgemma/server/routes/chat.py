"""POST /v1/chat/completions: `n` choices (one prompt computation), vLLM's fields (logprobs / top_logprobs,
return_token_ids, stream_options, response_format / structured_outputs, tools / tool_choice).
Messages go through the chat template with their image and audio parts (multimodal/chat.py)
and the offered tools (fastgemma/tools/) on the pre-processing thread; generation and
logprob formatting run on the worker. With tools offered, calls are parsed out of the text
into `tool_calls` (streamed as whole calls when their closing tag arrives) and the
finish_reason is "tool_calls"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from fastgemma.multimodal.chat import ContentPartError
from fastgemma.server import protocol as P
from fastgemma.server.errors import APIError
from fastgemma.server.generation import GenResult, Prepared, run_generation
from fastgemma.server.handling import (
    check_model,
    context_check,
    held_back,
    json_response,
    off_loop,
    parse_request,
    run_job,
    sampling_params,
    sse,
    stream,
    structured_outputs,
    submit,
    usage,
    validate_ids,
)
from fastgemma.server.state import ServerState
from fastgemma.server.worker import Job, TokenEvent
from fastgemma.tools import ToolCall, forced_grammar, offered_tools


@dataclass(frozen=True)
class ChatReply:
    """What one chat request's response is made of, besides its tokens."""

    req: P.ChatCompletionRequest
    prepared: Prepared
    top_n: int  # top_logprobs
    tools: bool  # tools were offered: parse calls out of the text
    id: str
    created: int
    model: str


async def chat_completions(state: ServerState, request: Request, body: dict[str, Any]) -> Response:
    req = parse_request(P.ChatCompletionRequest, body, "/v1/chat/completions")
    check_model(state, req.model)
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    _check_tools(req)
    p = await off_loop(state, lambda: _prepare(state, req))
    offered = offered_tools(req.tools, req.tool_choice) is not None
    reply = ChatReply(req, p, req.top_logprobs or 0, offered, P.random_id("chatcmpl"), P.now(), state.served_model_name)
    if req.stream:
        return await _stream(state, request, reply)

    def work(job: Job) -> list[GenResult]:
        results = run_generation(job, state.metrics, [p])
        if req.logprobs:
            for r in results:
                r.extra["logprobs"] = state.formatter.chat_logprobs(r.token_ids, r.logprobs or [], reply.top_n)
        return results

    results = await run_job(state, request, work)
    if results is None:
        return Response(status_code=499)
    choices = []
    for i, r in enumerate(results):
        content, calls, finish_reason = r.text, [], r.finish_reason
        if reply.tools:
            content, calls = state.llm.tool_format.parse(r.text, r.token_ids)
            finish_reason = "tool_calls" if calls else finish_reason
        choices.append(P.ChatCompletionResponseChoice(
            index=i,
            message=P.ChatResponseMessage(content=content, tool_calls=[_tool_call(c) for c in calls] or None),
            logprobs=r.extra.get("logprobs"),
            finish_reason=finish_reason,
            token_ids=r.token_ids if req.return_token_ids else None,
        ))
    return json_response(P.ChatCompletionResponse(
        id=reply.id, created=reply.created, model=reply.model, choices=choices,
        usage=usage(len(p.ids), sum(len(r.token_ids) for r in results)),
        prompt_token_ids=p.ids if req.return_token_ids else None,
    ))


def _check_tools(req: P.ChatCompletionRequest) -> None:
    choice, names = req.tool_choice, [t.function.name for t in req.tools or []]
    if choice != "required" and not isinstance(choice, P.NamedToolChoice):
        return
    if not names:
        raise APIError(400, "tool_choice needs tools to choose from", "tool_choice")
    if isinstance(choice, P.NamedToolChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools", "tool_choice")


def _tool_call(call: ToolCall) -> P.ToolCall:
    return P.ToolCall(id=call.id, function=P.FunctionCall(name=call.name, arguments=call.arguments))


def _message(m: P.ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.template_content()}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _prepare(state: ServerState, req: P.ChatCompletionRequest) -> Prepared:
    """Pre-processing thread: the templated ids, the decoded media, budget and parameters."""
    messages = [_message(m) for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, P.NamedToolChoice) else req.tool_choice
    offered = offered_tools(tools, choice)
    try:
        grammar = forced_grammar(state.llm.tool_format, tools, choice, req.parallel_tool_calls is not False)
    except ValueError as e:
        raise APIError(400, str(e), "tools") from None
    try:
        ids, multimodal = state.llm.chat_inputs(messages, state.allow_remote_media, offered)
    except ContentPartError as e:
        raise APIError(400, str(e), e.param) from None
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    except Exception as e:  # a template that rejects this conversation (roles must alternate, ...)
        raise APIError(400, f"cannot apply the chat template: {e}", "messages") from None
    validate_ids(state, ids, "messages")
    max_tokens = context_check(state, len(ids), req.requested_max_tokens, "max_tokens")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(state, req, max_tokens, logprobs, structured_outputs(state, req, grammar))
    return Prepared(ids, params, max_tokens, multimodal=multimodal)


async def _stream(state: ServerState, request: Request, reply: ChatReply) -> StreamingResponse:
    fmt, p = state.formatter, reply.prepared

    def work(job: Job) -> None:
        def on_token(i: int, delta: Any, lps: dict[int, float] | None) -> None:
            lp = None
            if lps is not None and delta.token_id is not None:
                lp = fmt.chat_logprobs([delta.token_id], [lps], reply.top_n)
            job.emit(TokenEvent(i, delta.text, delta.token_id, delta.finish_reason, lp))

        run_generation(job, state.metrics, [p], on_token)

    job = submit(state, work)
    return await stream(request, job, lambda job: _events(state, reply, job))


async def _events(state: ServerState, reply: ChatReply, job: Job) -> AsyncIterator[str]:
    req, n_prompt, n_gen = reply.req, len(reply.prepared.ids), 0
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

    def chunk(index: int, delta: P.DeltaMessage, event: TokenEvent | None = None) -> str:
        ids = None
        if event is not None and req.return_token_ids and event.token_id is not None:
            ids = [event.token_id]
        choice = P.ChatStreamChoice(
            index=index, delta=delta, logprobs=event and event.logprobs,
            finish_reason=event and event.finish_reason, token_ids=ids,
        )
        counted = usage(n_prompt, n_gen) if continuous else None
        return sse(P.ChatCompletionStreamResponse(
            id=reply.id, created=reply.created, model=reply.model, choices=[choice], usage=counted
        ))

    n = reply.prepared.params.n
    calls = [state.llm.tool_format.stream() for _ in range(n)] if reply.tools else None  # per choice
    for index in range(n):
        yield chunk(index, P.DeltaMessage(role="assistant", content=""))
    while True:
        is_event, event = await job.next()
        if not is_event:
            break
        n_gen += event.token_id is not None
        index = event.index
        if calls is not None:  # content outside the calls; each call whole when it closes
            parser = calls[index]
            text, done = parser.feed(event.text, event.token_id)
            if event.finish_reason is not None:
                text += parser.flush()
            first = len(parser.calls) - len(done)
            for i, call in enumerate(done, first):
                yield chunk(index, P.DeltaMessage(tool_calls=[P.DeltaToolCall(
                    index=i, id=call.id, type="function",
                    function=P.DeltaFunctionCall(name=call.name, arguments=call.arguments),
                )]))
            if event.finish_reason is not None and parser.calls:
                event = replace(event, finish_reason="tool_calls")
            event = replace(event, text=text)
        if held_back(event, req.return_token_ids):
            continue
        yield chunk(index, P.DeltaMessage(content=event.text) if event.text else P.DeltaMessage(), event)
    if include_usage:
        yield sse(P.ChatCompletionStreamResponse(
            id=reply.id, created=reply.created, model=reply.model, choices=[], usage=usage(n_prompt, n_gen)
        ))
