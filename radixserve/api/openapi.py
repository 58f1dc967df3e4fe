"""The OpenAPI document the server really follows.

FastAPI documents a 422 ``HTTPValidationError`` for every route with a body; this server answers
bad bodies with 400 in OpenAI's error shape (``radixserve.api.errors``). :func:`install_openapi`
replaces those with the responses every route can give (400, 401, 413, 503 as an
:class:`ErrorResponse`) and the routes declare their own success bodies (``ROUTE_RESPONSES``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from radixserve.api.openai.bodies import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)

_ERRORS: dict[int, str] = {
    400: "bad parameters, malformed JSON, a prompt longer than the context",
    401: "a missing or wrong API key (only with --api-key)",
    404: "a model (or LoRA adapter) this server does not serve",
    413: "a body larger than --max-request-bytes",
    503: "the scheduler is gone, or the server is shutting down",
}
_SSE = {"text/event-stream": {"schema": {"type": "string"}}}


def _ok(model: Any, stream: bool = False) -> dict[int | str, dict[str, Any]]:
    ok: dict[str, Any] = {"model": model, "description": "the result"}
    if stream:
        ok["content"] = _SSE
        ok["description"] = "the result; with stream=true, server-sent events ending in [DONE]"
    return {200: ok}


# the success bodies of the routes that return a Response object
ROUTE_RESPONSES: dict[str, dict[int | str, dict[str, Any]]] = {
    "completions": _ok(CompletionResponse, stream=True),
    "chat": _ok(ChatCompletionResponse, stream=True),
    "generate": {
        200: {
            "description": "one result object, or a list for a batch; with stream=true, "
            "server-sent events ending in [DONE]",
            "content": {
                "application/json": {
                    "schema": {
                        "anyOf": [
                            {"type": "object"},
                            {"type": "array", "items": {"type": "object"}},
                        ]
                    }
                },
                **_SSE,
            },
        }
    },
    "models": _ok(ModelList),
    "text": {200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    "empty": {200: {"description": "healthy (empty body)"}},
}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` return the corrected document (built once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _build(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title,
        version=app.version,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorResponse"] = ErrorResponse.model_json_schema(
        ref_template="#/components/schemas/{model}"
    )
    defs = components["ErrorResponse"].pop("$defs", {})
    components.update(defs)
    for key in ("HTTPValidationError", "ValidationError"):
        components.pop(key, None)
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in _errors_of(path, method):
                responses.setdefault(
                    str(status),
                    {
                        "description": _ERRORS[status],
                        "content": {"application/json": {"schema": error_ref}},
                    },
                )
    return schema


def _errors_of(path: str, method: str) -> list[int]:
    if path == "/health":
        return [503]
    statuses = [400, 401, 503]
    if method == "post":
        statuses.append(413)
    if path in ("/v1/completions", "/v1/chat/completions", "/v1/unload_lora_adapter"):
        statuses.append(404)
    return sorted(statuses)
