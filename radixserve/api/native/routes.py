"""SGLang's native routes: ``/generate`` and ``/abort_request`` (a tenant's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixserve.api.access.routes import Access, declare
from radixserve.api.access.tenants import Tenants
from radixserve.api.errors import APIError
from radixserve.api.native.protocol import AbortReqInput, GenerateReqInput
from radixserve.api.native.serving import NativeServing
from radixserve.api.openapi import SSE
from radixserve.server.rid_scope import client_rid, scope_of, scoped_rid
from radixserve.server.tokenizer_manager import TokenizerManager

GENERATE_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "one result object, or a list for a batch; with stream=true, "
        "server-sent events ending in [DONE]",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]
                }
            },
            **SSE,
        },
    }
}


def abort_matcher(body: AbortReqInput, scope: str | None) -> Callable[[str], bool]:
    """Which scheduler rids an abort reaches: ``scope`` None (an operator, or an open server)
    any request of that client rid (every one with ``abort_all``); else that scope's only."""
    if scope is None:
        return lambda rid: body.abort_all or client_rid(rid) == body.rid
    if body.abort_all:
        return lambda rid: scope_of(rid) == scope
    target = scoped_rid(scope, body.rid)
    return lambda rid: rid == target


def native_router(tm: TokenizerManager, tenants: Tenants, native: NativeServing) -> APIRouter:
    router = APIRouter()

    @router.post("/generate", responses=GENERATE_OK)
    async def generate(body: GenerateReqInput, raw: Request) -> Response:
        return await native.generate(body, raw)

    @router.post("/abort_request")
    async def abort_request(body: AbortReqInput, raw: Request) -> dict[str, Any]:
        """A tenant's abort reaches its own requests only (rids are scoped to it); an operator's
        reaches every tenant's; ``abort_all`` is an operator's call where there is one."""
        if not body.abort_all and not body.rid:
            raise APIError("give rid or abort_all", param="rid")
        operator = tenants.is_operator(raw.state)
        if body.abort_all and not operator and tenants.admin_keys:
            raise APIError("abort_all needs an admin API key", 403, code="admin_key_required")
        scope = tenants.scope(raw.state)
        aborted = tm.abort_where(abort_matcher(body, None if operator else scope))
        return {"aborted": [client_rid(r) for r in aborted]}

    return declare(router, Access.TENANT)
