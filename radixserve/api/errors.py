"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Status codes:

- 400 ``invalid_request_error``: bad parameters, malformed JSON, missing fields, wrong types,
  prompts longer than the context (FastAPI's 422 validation errors are answered as 400 here);
- 401 ``invalid_api_key``: a missing or wrong ``Authorization: Bearer`` key;
- 413 ``request_too_large``: a body over ``--max-request-bytes`` (``radixserve.api.access.guard``);
- 408 ``request_timeout``: a request body slower than ``--request-body-timeout`` or
  ``--min-request-body-rate`` (``radixserve.launch.connections``; the connection closes);
- 404 ``model_not_found``: a ``model`` the server does not serve, as OpenAI and vLLM answer, so
  the official clients raise ``NotFoundError`` as they would against those;
- 503 ``service_unavailable``: the scheduler process is gone (the log says why);
- 500 ``server_error``: a bug;
- 499 (no body): the client disconnected before the response (its request was aborted).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.server.request_state import (
    ClientDisconnected,
    RequestFailed,
    SchedulerUnavailable,
)

logger = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's code for a client that left before the response
RETRY_AFTER_S = 1  # a full queue drains at the batch's pace: ask again soon
TOO_DEEP_BODY = "the request body nests JSON deeper than the server parses (about 1,000 levels)"


class APIError(Exception):
    def __init__(
        self,
        message: str,
        status_code: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def to_api_error(exc: BaseException) -> APIError:
    """The APIError for an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, SchedulerUnavailable):
        return APIError(
            f"the scheduler is unavailable: {exc}".splitlines()[0],
            503,
            "service_unavailable",
            code="scheduler_unavailable",
        )
    if isinstance(exc, RequestFailed):
        if exc.status_code == 429:  # --max-queued-requests: OpenAI's shape of a rate limit
            return APIError(str(exc), 429, "requests", code="rate_limit_exceeded")
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return APIError(str(exc), exc.status_code, kind)
    if isinstance(exc, ValueError):
        return APIError(str(exc), 400)
    logger.error("internal error while serving a request", exc_info=exc)
    return APIError(f"internal server error: {exc!r}", 500, "server_error")


def conversion_error(exc: Exception, prefix: str = "") -> APIError:
    """The 400 of a body another door could not turn into the chat route's request: a
    validation error names its first field, any other error is said after ``prefix``."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return APIError(f"{where}: {first['msg']}" if where else first["msg"])
    return APIError(f"{prefix}{exc}")


def error_response(exc: BaseException) -> JSONResponse:
    err = to_api_error(exc)
    return JSONResponse(openai_shape(err), status_code=err.status_code, headers=_headers(err))


def _headers(err: APIError) -> dict[str, str] | None:
    if err.status_code == 401:
        return {"WWW-Authenticate": "Bearer"}
    if err.status_code == 429:
        return {"Retry-After": str(RETRY_AFTER_S)}
    return None


# a union's branch that the value does not even have the type of: noise beside the real error
_WRONG_BRANCH = {"model_type", "list_type", "dict_type", "model_attributes_type"}


def _loc(error: dict[str, Any]) -> str | None:
    """A field's dotted path, without ``body`` and pydantic's union branch tags."""
    parts = [
        str(p) for p in error.get("loc", ()) if p != "body" and not re.search(r"[\[(]", str(p))
    ]
    return ".".join(parts) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = list(exc.errors())
    if not errors:
        return "invalid request", None
    real = [e for e in errors if e.get("type") not in _WRONG_BRANCH]
    errors = real or errors
    first = errors[0]
    param = _loc(first)
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {msg}", None
    if first.get("type") == "missing":
        if param is None:  # the body itself
            return "the request body is missing: send a JSON object", None
        return f"missing required field: {param}", param
    if first.get("type") == "extra_forbidden":
        unknown = [str(_loc(e)) for e in errors if e.get("type") == "extra_forbidden"]
        return f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}", param
    if first.get("type") == "value_error":  # a model's own check: its message says it all
        msg = msg.removeprefix("Value error, ")
        field = getattr(first.get("ctx", {}).get("error"), "param", None)
        if isinstance(field, str):  # the field it names (UnsupportedField)
            param = f"{param}.{field}" if param else field
    extra = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + extra, param


class UnhandledErrors:
    """The last net, outside every other middleware: an exception that no handler took (a bug,
    or a per-request object such as a parser failing) becomes that request's OpenAI-shaped 500,
    logged once; if its response had started (a stream), the response just ends. It is never
    re-raised into the server: Starlette's own last net sends the 500 and then re-raises, and
    uvicorn answers that by dropping the connection, so the client saw a reset."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            response = error_response(exc)
            if not started:
                await response(scope, receive, send)


ErrorShape = Callable[[APIError], dict[str, Any]]


def openai_shape(err: APIError) -> dict[str, Any]:
    return error_body(err.message, err.type, err.param, err.code)


def install_error_handlers(app: FastAPI, shapes: Mapping[str, ErrorShape] | None = None) -> None:
    """Every error a route raises, answered in its protocol's shape: ``shapes`` maps a path
    prefix to its door's (Anthropic's under ``/v1/messages``); OpenAI's otherwise."""
    prefixes = sorted((shapes or {}).items(), key=lambda kv: -len(kv[0]))

    def respond(request: Request, err: APIError, headers: Any = None) -> JSONResponse:
        path = request.url.path
        shape = next((f for prefix, f in prefixes if path.startswith(prefix)), openai_shape)
        return JSONResponse(shape(err), status_code=err.status_code, headers=headers)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return respond(request, APIError(message, 400, param=param))

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        detail = str(exc.detail)
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's json.loads of the body
            detail = TOO_DEEP_BODY
        err = APIError(detail, exc.status_code, kind)
        return respond(request, err, getattr(exc, "headers", None))

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        err = to_api_error(exc)
        return respond(request, err, _headers(err))

    async def on_disconnect(request: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is there to read it

    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnected, on_disconnect)
    for cls in (APIError, ValueError, SchedulerUnavailable, RequestFailed, Exception):
        app.add_exception_handler(cls, on_error)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """Every error the server sends: OpenAI's shape (``radixserve.api.errors``)."""

    error: ErrorDetail
