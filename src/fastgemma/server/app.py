"""The FastAPI app: OpenAI-compatible routes over one `LLM`.

    app = build_app(llm, served_model_name="gemma", api_key=None, max_queue=64)

Routes: `GET /v1/models`, `GET /health`, `GET /metrics`, `POST /v1/completions`,
`POST /v1/chat/completions` (both with SSE streaming).

A request is parsed and validated here (tokenised on a pre-processing thread, checked
against the vocabulary and the context length) before it takes a queue slot, so a bad
request is a 400 at once and a good one that finds the queue full is a 429. Engine work
then runs on the worker thread in arrival order. A client that disconnects has its request
cancelled, waiting or running. Every error is OpenAI-style JSON (`errors.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.multimodal.chat import ContentPartError
from fastgemma.server import protocol as P
from fastgemma.server.errors import APIError, error_response, from_validation_error
from fastgemma.server.generation import Formatter, GenResult, Prepared, run_generation
from fastgemma.server.metrics import Metrics
from fastgemma.server.worker import Cancelled, Job, QueueFull, Worker

log = logging.getLogger("fastgemma.server")

MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class ServerState:
    llm: Any
    served_model_name: str
    api_key: str | None
    worker: Worker
    metrics: Metrics
    formatter: Formatter
    preprocess: ThreadPoolExecutor
    created: int
    allow_remote_media: bool = False  # fetch http(s) image URLs in chat content parts


def build_app(
    llm: Any,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = 64,
    allow_remote_media: bool = False,
) -> FastAPI:
    """An app serving `llm` under `served_model_name` (default `llm.model_name`).

    `api_key`: when set, /v1 routes need `Authorization: Bearer <api_key>`.
    `max_queue`: requests that may wait for the engine (besides the running one); more get 429.
    `allow_remote_media`: fetch http(s) image URLs of chat content parts (off: a 400 says so).
    """
    name = served_model_name or llm.model_name
    metrics = Metrics(name)
    state = ServerState(
        llm=llm,
        served_model_name=name,
        api_key=api_key or None,
        worker=Worker(max_queue, metrics),
        metrics=metrics,
        formatter=Formatter(llm.tokenizer),
        preprocess=ThreadPoolExecutor(1, thread_name_prefix="fastgemma-preprocess"),
        created=P.now(),
        allow_remote_media=allow_remote_media,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.worker.stop()
        state.preprocess.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="fastgemma", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.fastgemma = state

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        async def handler(_: Any) -> Response:
            card = P.ModelCard(
                id=name, created=state.created, root=str(getattr(llm, "model_name", name)), max_model_len=llm.max_model_len
            )
            return _json(P.ModelList(data=[card]))

        return await _handle(state, request, "/v1/models", handler, parse=False)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _handle(state, request, "/v1/completions", lambda body: _completions(state, request, body))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _handle(state, request, "/v1/chat/completions", lambda body: _chat(state, request, body))

    return app


# ---- plumbing ---------------------------------------------------------------------------


async def _handle(
    state: ServerState,
    request: Request,
    endpoint: str,
    handler: Callable[[Any], Awaitable[Response]],
    parse: bool = True,
) -> Response:
    try:
        _check_auth(state, request)
        body = await _read_json(request) if parse else None
        response = await handler(body)
    except APIError as e:
        response = error_response(e.status, e.message, e.param)
    except ValidationError as e:
        err = from_validation_error(e)
        response = error_response(err.status, err.message, err.param)
    state.metrics.count_request(endpoint, response.status_code)
    return response


def _check_auth(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'")


async def _read_json(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


def _json(model: Any, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.served_model_name:
        raise APIError(404, f"The model `{model}` does not exist. Served: `{state.served_model_name}`.", "model")


async def _off_loop(state: ServerState, fn: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(state.preprocess, fn)


def _submit(state: ServerState, fn: Callable[[Job], Any]) -> Job:
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


async def _run_job(state: ServerState, request: Request, work: Callable[[Job], Any]) -> Any:
    """Queue `work` on the engine and wait for its result (None: the client went away)."""
    job = _submit(state, work)
    try:
        return await _await_job(request, job)
    except Exception as e:
        raise _engine_error(e) from None


def _engine_error(e: Exception) -> APIError:
    if isinstance(e, ValueError):
        return APIError(400, str(e))
    log.error("engine error: %r", e)
    return APIError(500, f"engine error: {type(e).__name__}: {e}")


def _sse(obj: Any) -> str:
    body = obj if isinstance(obj, str) else obj.model_dump_json()
    return f"data: {body}\n\n"


async def _stream(request: Request, job: Job, events: Callable[[Job], AsyncIterator[str]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        try:
            async for chunk in events(job):
                yield chunk
        except Cancelled:
            return
        except Exception as e:  # after the 200 is sent: report in-band, then end the stream
            err = e if isinstance(e, APIError) else _engine_error(e)
            yield _sse(json.dumps({"error": {"message": err.message, "type": "InternalServerError" if err.status >= 500 else "BadRequestError", "param": None, "code": err.status}}))
        finally:
            watcher.cancel()
            if not job.finished:
                job.cancel()
        yield "data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


# ---- validation shared by both endpoints ------------------------------------------------


def _context_check(state: ServerState, n_prompt: int, max_tokens: int | None, param: str) -> int:
    limit = state.llm.max_model_len
    if max_tokens is None:
        max_tokens = limit - n_prompt
        if max_tokens < 1:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens and the prompt has {n_prompt}: "
                "no room to generate. Please reduce the length of the prompt.",
                param,
            )
        return max_tokens
    if n_prompt + max_tokens > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} in the completion). "
            "Please reduce the length of the prompt or completion.",
            param,
        )
    return max_tokens


def _sampling_params(state: ServerState, req: Any, max_tokens: int, logprobs: int | None) -> SamplingParams:
    vocab = state.llm.spec.vocab_size
    stop_ids = list(req.stop_token_ids or [])
    if any(not 0 <= t < vocab for t in stop_ids):
        raise APIError(400, f"stop_token_ids must be in [0, {vocab})", "stop_token_ids")
    try:
        return SamplingParams(
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
        )
    except ValueError as e:
        raise APIError(400, str(e).split(" (got ")[0]) from None


def _validate_ids(state: ServerState, ids: list[int], param: str) -> None:
    try:
        state.llm.engine.validate_prompt(ids)
    except ValueError as e:
        raise APIError(400, str(e), param) from None


# ---- /v1/completions --------------------------------------------------------------------


async def _completions(state: ServerState, request: Request, body: dict[str, Any]) -> Response:
    req = P.CompletionRequest.model_validate(body)
    _check_model(state, req.model)
    llm = state.llm

    def prepare() -> list[Prepared]:
        prepared = []
        for prompt in req.prompts():
            try:
                ids = llm.encode_prompt(prompt, add_special_tokens=req.add_special_tokens)
            except ValueError as e:
                raise APIError(400, str(e), "prompt") from None
            _validate_ids(state, ids, "prompt")
            max_tokens = _context_check(state, len(ids), req.max_tokens, "max_tokens")
            params = _sampling_params(state, req, max_tokens, req.logprobs)
            text = ""
            if req.echo:
                text = prompt if isinstance(prompt, str) else llm.tokenizer.decode(ids, skip_special_tokens=False)
            prepared.append(Prepared(ids, params, max_tokens, text))
        return prepared

    prepared = await _off_loop(state, prepare)
    fmt = state.formatter

    def finish(p: Prepared, r: GenResult) -> None:
        """Worker side, after generation: prompt scoring and logprob formatting."""
        entries = None
        k = max(req.prompt_logprobs or 0, req.logprobs or 0)
        if req.prompt_logprobs is not None or (req.echo and req.logprobs is not None):
            entries = llm.prompt_logprobs(p.ids, top=k)
        if req.prompt_logprobs is not None:
            r.extra["prompt_logprobs"] = fmt.prompt_logprobs(p.ids, _trim_top(entries, req.prompt_logprobs))
        if req.logprobs is not None:
            ids, lps, start = r.token_ids, list(r.logprobs or []), 0
            if req.echo:
                prompt_lps = [None] + [
                    {**dict(e.top[: req.logprobs]), p.ids[i + 1]: e.logprob} for i, e in enumerate(entries[1:])
                ]
                ids, lps = p.ids + ids, prompt_lps + lps
            r.extra["logprobs"] = fmt.completion_logprobs(ids, lps, start)

    if req.stream:
        return await _stream_completions(state, request, req, prepared, finish)

    def work(job: Job) -> list[GenResult]:
        results = []
        for p in prepared:
            r = run_generation(job, llm, state.metrics, p)
            finish(p, r)
            results.append(r)
        return results

    results = await _run_job(state, request, work)
    if results is None:
        return Response(status_code=499)
    choices = []
    for i, (p, r) in enumerate(zip(prepared, results)):
        choices.append(
            P.CompletionResponseChoice(
                index=i,
                text=p.prompt_text + r.text,
                logprobs=r.extra.get("logprobs"),
                finish_reason=r.finish_reason,
                prompt_logprobs=r.extra.get("prompt_logprobs"),
                token_ids=r.token_ids if req.return_token_ids else None,
                prompt_token_ids=p.ids if req.return_token_ids else None,
            )
        )
    usage = _usage(sum(len(p.ids) for p in prepared), sum(len(r.token_ids) for r in results))
    return _json(P.CompletionResponse(id=P.random_id("cmpl"), created=P.now(), model=state.served_model_name, choices=choices, usage=usage))


def _trim_top(entries: list[Any] | None, k: int) -> list[Any]:
    from fastgemma.engine.model_runner import PositionLogprob

    return [None if e is None else PositionLogprob(e.logprob, e.rank, e.top[:k]) for e in entries or []]


def _usage(prompt: int, completion: int) -> P.UsageInfo:
    return P.UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


async def _stream_completions(
    state: ServerState,
    request: Request,
    req: P.CompletionRequest,
    prepared: list[Prepared],
    finish: Callable[[Prepared, GenResult], None],
) -> StreamingResponse:
    llm, fmt = state.llm, state.formatter
    rid, created, model = P.random_id("cmpl"), P.now(), state.served_model_name
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

    def work(job: Job) -> None:
        for i, p in enumerate(prepared):
            if p.prompt_text:
                job.emit(("text", i, p.prompt_text, None, None, None))

            def on_token(delta: Any, lps: dict[int, float] | None, i: int = i) -> None:
                lp = None
                if lps is not None and delta.token_id is not None:
                    lp = fmt.completion_logprobs([delta.token_id], [lps])
                job.emit(("text", i, delta.text, delta.token_id, delta.finish_reason, lp))

            r = run_generation(job, llm, state.metrics, p, on_token)
            if p.max_tokens == 0:
                job.emit(("text", i, "", None, "length", None))
            finish(p, r)
            job.emit(("end", i, r))

    job = _submit(state, work)

    async def events(job: Job) -> AsyncIterator[str]:
        n_prompt = sum(len(p.ids) for p in prepared)
        n_gen = 0
        while True:
            is_item, item = await job.next()
            if not is_item:
                break
            kind, i = item[0], item[1]
            if kind == "end":
                continue
            _, _, text, token_id, reason, lp = item
            n_gen += token_id is not None
            if not text and reason is None and lp is None:
                continue  # held back (incomplete character or possible stop string)
            choice = P.CompletionStreamChoice(
                index=i,
                text=text,
                logprobs=lp,
                finish_reason=reason,
                token_ids=[token_id] if (req.return_token_ids and token_id is not None) else None,
            )
            usage = _usage(n_prompt, n_gen) if continuous else None
            yield _sse(P.CompletionStreamResponse(id=rid, created=created, model=model, choices=[choice], usage=usage))
        if include_usage:
            yield _sse(P.CompletionStreamResponse(id=rid, created=created, model=model, choices=[], usage=_usage(n_prompt, n_gen)))

    return await _stream(request, job, events)


# ---- /v1/chat/completions ---------------------------------------------------------------


async def _chat(state: ServerState, request: Request, body: dict[str, Any]) -> Response:
    req = P.ChatCompletionRequest.model_validate(body)
    _check_model(state, req.model)
    llm = state.llm
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.template_content()} for m in req.messages
    ]
    top_n = req.top_logprobs or 0
    logprobs = top_n if req.logprobs else None
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")

    def prepare() -> Prepared:
        try:  # media are decoded and preprocessed here, off the event loop and the engine's thread
            ids, multimodal = llm.chat_inputs(messages, state.allow_remote_media)
        except ContentPartError as e:
            raise APIError(400, str(e), e.param) from None
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        except Exception as e:  # a template that rejects this conversation (roles must alternate, ...)
            raise APIError(400, f"cannot apply the chat template: {e}", "messages") from None
        _validate_ids(state, ids, "messages")
        max_tokens = _context_check(state, len(ids), req.requested_max_tokens, "max_tokens")
        return Prepared(ids, _sampling_params(state, req, max_tokens, logprobs), max_tokens, multimodal=multimodal)

    p = await _off_loop(state, prepare)
    fmt = state.formatter
    rid, created, model = P.random_id("chatcmpl"), P.now(), state.served_model_name

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

        def stream_work(job: Job) -> None:
            def on_token(delta: Any, lps: dict[int, float] | None) -> None:
                lp = None
                if lps is not None and delta.token_id is not None:
                    lp = fmt.chat_logprobs([delta.token_id], [lps], top_n)
                job.emit((delta.text, delta.token_id, delta.finish_reason, lp))

            run_generation(job, llm, state.metrics, p, on_token)

        job = _submit(state, stream_work)

        async def events(job: Job) -> AsyncIterator[str]:
            n_gen = 0

            def chunk(delta: P.DeltaMessage, reason: str | None = None, lp: Any = None, ids: Any = None) -> str:
                choice = P.ChatStreamChoice(index=0, delta=delta, logprobs=lp, finish_reason=reason, token_ids=ids)
                usage = _usage(len(p.ids), n_gen) if continuous else None
                return _sse(P.ChatCompletionStreamResponse(id=rid, created=created, model=model, choices=[choice], usage=usage))

            yield chunk(P.DeltaMessage(role="assistant", content=""))
            while True:
                is_item, item = await job.next()
                if not is_item:
                    break
                text, token_id, reason, lp = item
                n_gen += token_id is not None
                if not text and reason is None and lp is None:
                    continue
                ids = [token_id] if (req.return_token_ids and token_id is not None) else None
                yield chunk(P.DeltaMessage(content=text) if text else P.DeltaMessage(), reason, lp, ids)
            if include_usage:
                yield _sse(P.ChatCompletionStreamResponse(id=rid, created=created, model=model, choices=[], usage=_usage(len(p.ids), n_gen)))

        return await _stream(request, job, events)

    def work(job: Job) -> GenResult:
        r = run_generation(job, llm, state.metrics, p)
        if logprobs is not None:
            r.extra["logprobs"] = fmt.chat_logprobs(r.token_ids, r.logprobs or [], top_n)
        return r

    r = await _run_job(state, request, work)
    if r is None:
        return Response(status_code=499)
    choice = P.ChatCompletionResponseChoice(
        index=0,
        message=P.ChatResponseMessage(content=r.text),
        logprobs=r.extra.get("logprobs"),
        finish_reason=r.finish_reason,
        token_ids=r.token_ids if req.return_token_ids else None,
    )
    return _json(
        P.ChatCompletionResponse(
            id=rid,
            created=created,
            model=model,
            choices=[choice],
            usage=_usage(len(p.ids), len(r.token_ids)),
            prompt_token_ids=p.ids if req.return_token_ids else None,
        )
    )
