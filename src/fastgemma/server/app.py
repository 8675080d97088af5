"""The FastAPI app: OpenAI-compatible routes over one `LLM`.

    app = build_app(llm, served_model_name="gemma", api_key=None, max_queue=64)

Routes (routes/): `GET /v1/models`, `GET /health`, `GET /metrics`, `POST /v1/completions`,
`POST /v1/chat/completions` (both with SSE streaming).

A request is parsed and validated (tokenised on a pre-processing thread, checked against the
vocabulary and the context length) before it takes a queue slot, so a bad request is a 400
at once and a good one that finds the queue full is a 429. Each request's work then runs on a
job thread while the engine's one loop steps every running request together (worker.py). A client that disconnects has its request
cancelled, waiting or running. Every error is OpenAI-style JSON (errors.py); the plumbing
every route shares is in handling.py.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastgemma.server import protocol as P
from fastgemma.server.errors import error_response
from fastgemma.server.generation import Formatter
from fastgemma.server.handling import authorized, draining_response, handle
from fastgemma.server.metrics import Metrics
from fastgemma.server.routes.chat import chat_completions
from fastgemma.server.routes.completions import completions
from fastgemma.server.routes.models import models
from fastgemma.server.state import ServerState
from fastgemma.server.worker import Worker

log = logging.getLogger("fastgemma.server")


def build_app(
    llm: Any,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = 64,
    allow_remote_media: bool = False,
) -> FastAPI:
    """An app serving `llm` under `served_model_name` (default `llm.model_name`).

    `api_key`: when set, /v1 routes need `Authorization: Bearer <api_key>`.
    `max_queue`: requests that may wait for the engine (besides the `max_num_seqs` running); more get 429.
    `allow_remote_media`: fetch http(s) image URLs of chat content parts (off: a 400 says so).
    """
    name = served_model_name or llm.model_name
    metrics = Metrics(name)
    state = ServerState(
        llm=llm,
        served_model_name=name,
        api_key=api_key or None,
        worker=Worker(max_queue, metrics, llm, max_running=llm.config.max_num_seqs),
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
        if request.url.path.startswith("/v1") and not authorized(state, request):
            return error_response(401, "invalid or missing API key: send 'Authorization: Bearer <key>'")  # as vLLM
        response = error_response(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})  # 405: Allow
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}")

    @app.get("/health")
    async def health() -> Response:  # 200 serving; 503 draining (a readiness probe takes the replica out)
        return draining_response() if state.draining else Response(status_code=200)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models", responses=_documented(None, P.ModelList))
    async def models_route(request: Request) -> Response:
        return await handle(state, request, "/v1/models", lambda body: models(state, body), parse=False)

    @app.post("/v1/completions", **_documented(P.CompletionRequest, P.CompletionResponse, P.CompletionStreamResponse))
    async def completions_route(request: Request) -> Response:
        return await handle(state, request, "/v1/completions", lambda body: completions(state, request, body))

    @app.post(
        "/v1/chat/completions",
        **_documented(P.ChatCompletionRequest, P.ChatCompletionResponse, P.ChatCompletionStreamResponse),
    )
    async def chat_route(request: Request) -> Response:
        return await handle(state, request, "/v1/chat/completions", lambda body: chat_completions(state, request, body))

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


# ---- the OpenAPI document ---------------------------------------------------------------
# The handlers read the raw body (to refuse hostile input before pydantic sees it), so
# FastAPI cannot infer the request models; they are declared here, with the responses, so
# that client generators and fuzzers can use /openapi.json.

_DOCUMENTED = (P.CompletionRequest, P.ChatCompletionRequest, P.ModelList, P.CompletionResponse,
               P.CompletionStreamResponse, P.ChatCompletionResponse, P.ChatCompletionStreamResponse)
_REF = "#/components/schemas/{model}"


def _ref(model: type) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _documented(request: type | None, response: type, stream: type | None = None) -> dict[str, Any]:
    """Route keyword arguments declaring the JSON body, the response and (streaming) its SSE chunks."""
    content: dict[str, Any] = {"application/json": {"schema": _ref(response)}}
    if stream is not None:
        content["text/event-stream"] = {"schema": {"type": "string", "description": f"data: {stream.__name__} lines, then [DONE]"}}
    error = {"description": "OpenAI-style error", "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    responses = {200: {"description": "OK", "content": content}, 400: error, 401: error, 404: error, 429: error, 503: error}
    if request is None:
        return responses
    body = {"required": True, "content": {"application/json": {"schema": _ref(request)}}}
    return {"responses": responses, "openapi_extra": {"requestBody": body}}


_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
        "code": {"type": "integer"},
    }}},
}


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi
        from pydantic.json_schema import models_json_schema

        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        _, defs = models_json_schema([(m, "validation") for m in _DOCUMENTED], ref_template=_REF)
        doc.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        app.openapi_schema = doc
    return app.openapi_schema
