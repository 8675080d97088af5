"""The request plumbing every route shares: auth, JSON bodies, the queue, disconnects, SSE,
and the checks both generation routes make (context length, sampling parameters, ids).

A route's handler raises `APIError` for a bad request; `handle` turns it into OpenAI-style
JSON and counts the request. Engine work goes through `run_job` (wait for the result) or
`submit` + `stream` (server-sent events); a client that disconnects has its job cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.structured_output import StructuredOutputsParams
from fastgemma.server import protocol as P
from fastgemma.server.errors import APIError, error_response, from_validation_error
from fastgemma.server.state import ServerState
from fastgemma.server.worker import Cancelled, Job, QueueFull

log = logging.getLogger("fastgemma.server")

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64  # arrays / objects nested deeper are refused
MAX_JSON_VALUES = 1 << 18  # array elements / object members: bounds the objects a parse makes
MAX_JSON_CONTAINERS = 1 << 14  # arrays and objects: bounds the objects validation builds
# A `\uD800`-`\uDFFF` escape: the only way JSON text in UTF-8 can carry a string that UTF-8
# cannot (a lone half of a pair). Emoji escaped as pairs match too; `json.dumps` then decides.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


async def handle(
    state: ServerState,
    request: Request,
    endpoint: str,
    handler: Callable[[Any], Awaitable[Response]],
    parse: bool = True,
) -> Response:
    """Authenticate, read the JSON body (`parse`), run `handler(body)`; errors as JSON.
    While the server drains (SIGTERM) every request is a 503 with `Retry-After`."""
    if state.draining:
        response = draining_response()
        state.metrics.count_request(endpoint, response.status_code)
        return response
    state.handling += 1
    try:
        _check_auth(state, request)
        body = await _read_json(request) if parse else None
        response = await handler(body)
    except APIError as e:
        response = error_response(e.status, e.message, e.param)
    except ValidationError as e:
        err = from_validation_error(e)
        response = error_response(err.status, err.message, err.param)
    finally:
        state.handling -= 1
    state.metrics.count_request(endpoint, response.status_code)
    return response


RETRY_AFTER_S = 1  # a draining server will not come back: retry at once, elsewhere


def draining_response() -> Response:
    """503 + `Retry-After`: what a draining server answers to new requests (and `/health`)."""
    response = error_response(503, "the server is shutting down (draining); retry the request on another replica")
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def authorized(state: ServerState, request: Request) -> bool:
    """No key is set, or the request carries it (`Authorization: Bearer <key>`)."""
    if state.api_key is None:
        return True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), state.api_key.encode())


def _check_auth(state: ServerState, request: Request) -> None:
    if not authorized(state, request):
        raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'")


async def _read_json(request: Request) -> Any:
    """The body as a JSON object, refused by its declared length before it is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes")
    return parse_json_body(raw)


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object, or an `APIError` 400 saying what to change.

    This runs on the event loop holding the GIL, so its cost is bounded for any body under
    `MAX_BODY_BYTES`: the values and containers are counted by C scans (`json_counts`) before
    the parser makes an object of each; later passes are C code or visit containers only,
    except the walk that names a field holding a lone surrogate, which runs only for a body
    refused for it (benchmarks/request_memory.py times the worst cases)."""
    values, containers = json_counts(raw)
    if values > MAX_JSON_VALUES:
        raise APIError(400, f"the request body holds more than {MAX_JSON_VALUES} JSON values; send fewer")
    if containers > MAX_JSON_CONTAINERS:
        raise APIError(400, f"the request body holds more than {MAX_JSON_CONTAINERS} arrays / objects; send fewer")
    try:
        text = raw.decode("utf-8-sig")  # strict; a leading BOM is dropped, as json.loads(bytes) did
        body = json.loads(text)
    except RecursionError:
        raise APIError(400, _TOO_DEEP) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON in UTF-8: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    if containers > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, _TOO_DEEP)
    if _SURROGATE_ESCAPE.search(text) and not _encodable(json.dumps(body, ensure_ascii=False)):
        where = _unencodable(body)
        raise APIError(400, f"{where or 'a key'}: the string holds a lone surrogate, which UTF-8 cannot carry", where or None)
    return body


def json_counts(raw: bytes) -> tuple[int, int]:
    """(values, containers) of a JSON text, counted outside strings with C scans only:
    `,` separators + 1 and the `[` / `{` openers. Escapes are dropped first (a backslash
    escapes the next byte, so removing `\\\\` pairs, then `\\"`, leaves only the quotes that
    delimit strings); the text between every other quote is outside strings. Invalid JSON
    gives some count; the parser then refuses it."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    quotes = text.count(b'"')
    if quotes > 4 * MAX_JSON_VALUES:  # keys and string values: more than the values allow
        return quotes // 2, 0
    outside = b"".join(text.split(b'"')[0::2])
    return outside.count(b",") + 1, outside.count(b"[") + outside.count(b"{")


_TOO_DEEP = f"the request body nests arrays / objects deeper than {MAX_JSON_DEPTH} levels"
_CONTAINERS = (list, dict)


def json_depth(value: Any) -> int:
    """How deeply arrays / objects nest in a parsed JSON value (a scalar: 0). Visits
    containers only: scalars are skipped by a comprehension, not a loop of ours."""
    deepest, level = 0, [value] if type(value) in _CONTAINERS else []
    while level:
        deepest += 1
        level = [x for c in level for x in (c.values() if type(c) is dict else c) if type(x) in _CONTAINERS]
    return deepest


def _unencodable(body: dict[str, Any]) -> str | None:
    """The path of the first string (key or value) that is not valid Unicode text, or None."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return path
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        children = []
        for key, item in items:
            where = f"{path}.{key}" if isinstance(key, str) and path else (key if isinstance(key, str) else f"{path}[{key}]")
            if isinstance(key, str) and not _encodable(key):
                return where
            children.append((item, where))
        stack.extend(reversed(children))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_response(model: Any, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.served_model_name:
        raise APIError(404, f"The model `{model}` does not exist. Served: `{state.served_model_name}`.", "model")


async def off_loop(state: ServerState, fn: Callable[[], Any]) -> Any:
    """`fn()` on the pre-processing thread (tokenising, media), awaited."""
    return await asyncio.get_running_loop().run_in_executor(state.preprocess, fn)


def submit(state: ServerState, fn: Callable[[Job], Any]) -> Job:
    try:
        return state.worker.submit(fn)
    except QueueFull as e:
        raise APIError(429, str(e)) from None


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client goes away (the body is already read)."""
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel()
                return
    except asyncio.CancelledError:
        raise
    except Exception:  # pragma: no cover - transport quirks: nothing to watch
        return


async def _await_job(request: Request, job: Job) -> Any:
    """The job's result; None when the client disconnected (the job is cancelled)."""
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        return await job.result()
    except Cancelled:
        return None
    finally:
        watcher.cancel()
        if not job.finished:
            job.cancel()


async def run_job(state: ServerState, request: Request, work: Callable[[Job], Any]) -> Any:
    """Queue `work` on the engine and wait for its result (None: the client went away)."""
    job = submit(state, work)
    try:
        return await _await_job(request, job)
    except Exception as e:
        raise _engine_error(e) from None


def _engine_error(e: Exception) -> APIError:
    if isinstance(e, ValueError):
        return APIError(400, str(e))
    log.error("engine error: %r", e)
    return APIError(500, f"engine error: {type(e).__name__}: {e}")


def sse(obj: Any) -> str:
    body = obj if isinstance(obj, str) else obj.model_dump_json()
    return f"data: {body}\n\n"


async def stream(request: Request, job: Job, events: Callable[[Job], AsyncIterator[str]]) -> StreamingResponse:
    """Server-sent events from `events(job)`, then `[DONE]`; an error after the 200 is
    reported in-band; a disconnect cancels the job."""

    async def body() -> AsyncIterator[str]:
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        try:
            async for chunk in events(job):
                yield chunk
        except Cancelled:
            return
        except Exception as e:  # after the 200 is sent: report in-band, then end the stream
            err = e if isinstance(e, APIError) else _engine_error(e)
            kind = "InternalServerError" if err.status >= 500 else "BadRequestError"
            yield sse(json.dumps({"error": {"message": err.message, "type": kind, "param": None, "code": err.status}}))
        finally:
            watcher.cancel()
            if not job.finished:
                job.cancel()
        yield "data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def held_back(event: Any, return_token_ids: bool) -> bool:
    """A streamed `TokenEvent` with nothing to send: no text yet (an incomplete character or a
    possible stop string), not the last, no logprobs, and its token id not asked for."""
    return not (event.text or event.finish_reason is not None or event.logprobs is not None
                or (return_token_ids and event.token_id is not None))


def usage(prompt: int, completion: int) -> P.UsageInfo:
    return P.UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


# ---- checks both generation routes make -------------------------------------------------


def context_check(state: ServerState, n_prompt: int, max_tokens: int | None, param: str) -> int:
    """The completion's token budget (vLLM's: the rest of the context when not given)."""
    try:
        return state.llm.engine.completion_budget(n_prompt, max_tokens)
    except ValueError as e:
        raise APIError(400, str(e), param) from None


def structured_outputs(
    state: ServerState, req: Any, tool_grammar: StructuredOutputsParams | None = None
) -> StructuredOutputsParams | None:
    """The request's output constraint (response_format, structured_outputs, or the tools'
    grammar under tool_choice "required" / a named function), checked here so that a bad
    schema, regex or grammar is a 400 naming its field before anything runs."""
    given = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        given.append("response_format")
    if req.structured_outputs is not None:
        given.append("structured_outputs")
    if tool_grammar is not None:
        given.append("tool_choice")
    if len(given) > 1:
        raise APIError(400, f"{given[0]} and {given[1]} both constrain the output; give one of them", given[1])
    if not given:
        return None
    try:
        if given[0] == "response_format":
            if rf.type == "json_object":
                params = StructuredOutputsParams(json_object=True, where="response_format")
            else:
                params = StructuredOutputsParams(
                    json=rf.json_schema.schema_ or {"type": "object"}, where="response_format.json_schema.schema"
                )
        elif given[0] == "structured_outputs":
            so = req.structured_outputs
            params = StructuredOutputsParams(
                json=so.json_, json_object=so.json_object, regex=so.regex, choice=so.choice, grammar=so.grammar,
                structural_tag=so.structural_tag, disable_any_whitespace=so.disable_any_whitespace,
                disable_additional_properties=so.disable_additional_properties,
            )
        else:
            params = tool_grammar
    except ValueError as e:
        raise APIError(400, str(e), given[0]) from None
    try:
        state.llm.engine.grammars.check(params)
    except ValueError as e:
        raise APIError(400, str(e), params.param) from None
    return params


def parse_request(cls: Any, body: dict[str, Any], endpoint: str) -> Any:
    """The body as `cls`: a field we do not honour is a 400 naming it; unknown fields are
    ignored and named in the log."""
    if (name := cls.unsupported_field(body)) is not None:
        raise APIError(400, f"{name} is not supported by fastgemma; leave it out", name)
    req = cls.model_validate(body)
    log_ignored_fields(req, endpoint)
    return req


def log_ignored_fields(req: Any, endpoint: str) -> None:
    """Name, once per request, the fields no schema of ours knows (vLLM logs the same)."""
    if ignored := req.ignored_fields():
        log.warning("%s: ignoring fields that are not part of the API: %s", endpoint, ", ".join(ignored))


def sampling_params(
    state: ServerState, req: Any, max_tokens: int, logprobs: int | None,
    structured: StructuredOutputsParams | None = None,
) -> SamplingParams:
    vocab, slots = state.llm.spec.vocab_size, state.llm.engine.runner.pool.num_seqs
    if req.n > slots:
        raise APIError(400, f"n={req.n} choices run at once and need {req.n} cache slots, but this server "
                            f"has --max-num-seqs {slots}; lower n", "n")
    stop_ids = list(req.stop_token_ids or [])
    if any(not 0 <= t < vocab for t in stop_ids):
        raise APIError(400, f"stop_token_ids must be in [0, {vocab})", "stop_token_ids")
    try:
        bias = req.logit_bias_ids()
    except ValueError as e:
        raise APIError(400, str(e), "logit_bias") from None
    if bias and any(t >= vocab for t in bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {vocab})", "logit_bias")
    try:
        return SamplingParams(
            n=req.n,
            min_p=req.min_p or 0.0,
            min_tokens=req.min_tokens or 0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=bias,
            max_tokens=max(1, max_tokens),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            seed=req.seed,
            stop=req.stop_list,
            stop_token_ids=stop_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
            structured_outputs=structured,
        )
    except ValueError as e:
        raise APIError(400, str(e)) from None


def validate_ids(state: ServerState, ids: list[int], param: str) -> None:
    try:
        state.llm.engine.validate_prompt(ids)
    except ValueError as e:
        raise APIError(400, str(e), param) from None
