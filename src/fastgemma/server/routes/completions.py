"""POST /v1/completions: every prompt of the request run together, `n` choices each (choice j
of prompt i has index i * n + j, as vLLM's; a prompt is computed once for its choices),
vLLM's fields (echo, logprobs, prompt_logprobs, return_token_ids, stream_options,
response_format / structured_outputs).
Prompts are tokenised and checked on the pre-processing thread; generation, prompt scoring
and logprob formatting run on the worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from fastgemma.engine.model_runner import PositionLogprob
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


async def completions(state: ServerState, request: Request, body: dict[str, Any]) -> Response:
    req = parse_request(P.CompletionRequest, body, "/v1/completions")
    check_model(state, req.model)
    prepared = await off_loop(state, lambda: _prepare(state, req))
    if req.stream:
        return await _stream(state, request, req, prepared)

    def work(job: Job) -> list[GenResult]:
        results = run_generation(job, state.metrics, prepared)  # every prompt's choices together
        for i, p in enumerate(prepared):
            _finish(state, req, p, results[i * req.n : (i + 1) * req.n])
        return results

    results = await run_job(state, request, work)
    if results is None:
        return Response(status_code=499)
    choices = [
        P.CompletionResponseChoice(
            index=index,
            text=p.prompt_text + r.text,
            logprobs=r.extra.get("logprobs"),
            finish_reason=r.finish_reason,
            prompt_logprobs=r.extra.get("prompt_logprobs"),
            token_ids=r.token_ids if req.return_token_ids else None,
            prompt_token_ids=p.ids if req.return_token_ids else None,
        )
        for index, (p, r) in enumerate(zip((p for p in prepared for _ in range(req.n)), results))
    ]
    total = usage(sum(len(p.ids) for p in prepared), sum(len(r.token_ids) for r in results))
    return json_response(P.CompletionResponse(
        id=P.random_id("cmpl"), created=P.now(), model=state.served_model_name, choices=choices, usage=total
    ))


def _prepare(state: ServerState, req: P.CompletionRequest) -> list[Prepared]:
    """Pre-processing thread: each prompt's ids, budget and sampling parameters."""
    llm, prepared = state.llm, []
    structured = structured_outputs(state, req)
    for prompt in req.prompts():
        try:
            ids = llm.encode_prompt(prompt, add_special_tokens=req.add_special_tokens)
        except ValueError as e:
            raise APIError(400, str(e), "prompt") from None
        validate_ids(state, ids, "prompt")
        max_tokens = context_check(state, len(ids), req.max_tokens, "max_tokens")
        params = sampling_params(state, req, max_tokens, req.logprobs, structured)
        text = ""
        if req.echo:
            text = prompt if isinstance(prompt, str) else llm.tokenizer.decode(ids, skip_special_tokens=False)
        prepared.append(Prepared(ids, params, max_tokens, text))
    return prepared


def _finish(state: ServerState, req: P.CompletionRequest, p: Prepared, results: list[GenResult]) -> None:
    """Worker side, after generation: prompt scoring (once for the prompt's choices) and
    logprob formatting."""
    fmt, entries = state.formatter, None
    k = max(req.prompt_logprobs or 0, req.logprobs or 0)
    if req.prompt_logprobs is not None or (req.echo and req.logprobs is not None):
        entries = state.worker.engine.call(lambda: state.llm.prompt_logprobs(p.ids, top=k))  # between engine steps
    prompt_logprobs = None
    if req.prompt_logprobs is not None:
        prompt_logprobs = fmt.prompt_logprobs(p.ids, _trim_top(entries, req.prompt_logprobs))
    for r in results:
        if prompt_logprobs is not None:
            r.extra["prompt_logprobs"] = prompt_logprobs
        if req.logprobs is not None:
            ids, lps = r.token_ids, list(r.logprobs or [])
            if req.echo:
                prompt_lps = [None] + [
                    {**dict(e.top[: req.logprobs]), p.ids[i + 1]: e.logprob} for i, e in enumerate(entries[1:])
                ]
                ids, lps = p.ids + ids, prompt_lps + lps
            r.extra["logprobs"] = fmt.completion_logprobs(ids, lps, 0)


def _trim_top(entries: list[Any] | None, k: int) -> list[Any]:
    return [None if e is None else PositionLogprob(e.logprob, e.rank, e.top[:k]) for e in entries or []]


async def _stream(state: ServerState, request: Request, req: P.CompletionRequest, prepared: list[Prepared]) -> StreamingResponse:
    fmt = state.formatter
    rid, created, model = P.random_id("cmpl"), P.now(), state.served_model_name
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

    def work(job: Job) -> None:
        n = req.n
        for i, p in enumerate(prepared):
            for j in range(n) if p.prompt_text else ():
                job.emit(TokenEvent(i * n + j, p.prompt_text))

        def on_token(index: int, delta: Any, lps: dict[int, float] | None) -> None:
            lp = None
            if lps is not None and delta.token_id is not None:
                lp = fmt.completion_logprobs([delta.token_id], [lps])
            job.emit(TokenEvent(index, delta.text, delta.token_id, delta.finish_reason, lp))

        results = run_generation(job, state.metrics, prepared, on_token)  # every prompt's choices together
        for i, p in enumerate(prepared):
            for j in range(n) if p.max_tokens == 0 else ():
                job.emit(TokenEvent(i * n + j, "", finish_reason="length"))
            _finish(state, req, p, results[i * n : (i + 1) * n])

    job = submit(state, work)

    async def events(job: Job) -> AsyncIterator[str]:
        n_prompt, n_gen = sum(len(p.ids) for p in prepared), 0
        while True:
            is_event, event = await job.next()
            if not is_event:
                break
            n_gen += event.token_id is not None
            if held_back(event, req.return_token_ids):
                continue
            choice = P.CompletionStreamChoice(
                index=event.index,
                text=event.text,
                logprobs=event.logprobs,
                finish_reason=event.finish_reason,
                token_ids=[event.token_id] if (req.return_token_ids and event.token_id is not None) else None,
            )
            counted = usage(n_prompt, n_gen) if continuous else None
            yield sse(P.CompletionStreamResponse(id=rid, created=created, model=model, choices=[choice], usage=counted))
        if include_usage:
            yield sse(P.CompletionStreamResponse(id=rid, created=created, model=model, choices=[], usage=usage(n_prompt, n_gen)))

    return await stream(request, job, events)
