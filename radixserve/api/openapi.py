"""The OpenAPI document the server really follows.

FastAPI documents a 422 ``HTTPValidationError`` for every route with a body; this server answers
bad bodies with 400 in OpenAI's error shape (``radixserve.api.errors``). :func:`install_openapi`
replaces those with the errors each route can give, derived from what it declares
(``_errors_of``: its access and its own 404), each as an :class:`ErrorResponse`; the routes
declare their own success bodies (:func:`ok_body`, :data:`TEXT`, :data:`EMPTY`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from radixserve.api.access.routes import Access, facts_of, routes_of
from radixserve.api.errors import ErrorResponse

_ERRORS: dict[int, str] = {
    400: "bad parameters, malformed JSON, a prompt longer than the context",
    401: "a missing or wrong API key (only with --api-key)",
    403: "an operator route called without an operator's key",
    404: "a model (or LoRA adapter) this server does not serve",
    413: "a body larger than --max-request-bytes",
    503: "the scheduler is gone, or the server is shutting down",
}
SSE = {"text/event-stream": {"schema": {"type": "string"}}}
TEXT: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}}
}
EMPTY: dict[int | str, dict[str, Any]] = {200: {"description": "healthy (empty body)"}}
# a route that answers 404 for a model or adapter it does not serve declares this
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": _ERRORS[404]}}


def ok_body(model: Any, stream: bool = False) -> dict[int | str, dict[str, Any]]:
    """A route's success body: ``model``, or server-sent events with ``stream``."""
    ok: dict[str, Any] = {"model": model, "description": "the result"}
    if stream:
        ok["content"] = SSE
        ok["description"] = "the result; with stream=true, server-sent events ending in [DONE]"
    return {200: ok}


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
    # keyed as the document writes a path: without a parameter's converter (``{model:path}``)
    errors = {route.path_format: _errors_of(route) for route in routes_of(app.routes)}
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in errors.get(path, [400, 503]) + ([413] if method == "post" else []):
                responses[str(status)] = {
                    "description": _ERRORS[status],
                    "content": {"application/json": {"schema": error_ref}},
                }
    return schema


def _errors_of(route: Any) -> list[int]:
    """The errors a route can answer, from what it declares: its access (401 for a key, 403
    for an operator's), the 404 it declares, and what every route can give (400, 503)."""
    facts = facts_of(route)
    if facts is not None and facts.access == Access.OPEN:
        return [503]
    statuses = [400, 401, 503]
    if facts is not None and facts.access == Access.OPERATOR:
        statuses.append(403)
    declared = getattr(route, "responses", None) or {}
    statuses += [int(status) for status in declared if int(status) >= 400]
    return sorted(set(statuses))
