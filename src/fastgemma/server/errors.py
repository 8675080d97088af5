"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`.

`APIError` is raised anywhere in request handling; the app turns it (and pydantic
validation errors, and anything unexpected) into one of these JSON bodies. Types follow
vLLM's names (`BadRequestError`, ...); `code` is the HTTP status.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def from_validation_error(e: ValidationError) -> APIError:
    """The first pydantic error as a 400, naming the offending field (`messages.0.content`)."""
    errors = e.errors(include_url=False)
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())]
    # Union members add their type name to the location (`prompt.str`); keep the field path.
    path = [p for p in loc if not _is_type_tag(p)]
    param = ".".join(path) or None
    message = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        message = "field required"
    return APIError(400, f"{param}: {message}" if param else message, param)


def _is_type_tag(part: str) -> bool:
    return part in {"str", "int", "float", "bool", "list[int]", "list[str]", "list[list[int]]", "none", "function-after"} or (
        "[" in part and "]" in part
    )
