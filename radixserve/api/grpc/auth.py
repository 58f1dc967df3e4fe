"""Who calls the gRPC service: the HTTP routes' keys and rules, on every method.

A call presents its key as metadata ``authorization: Bearer <key>`` (as smg sends it to its
workers). :class:`KeyInterceptor` refuses, before any method runs, a call without a key the
server takes (``UNAUTHENTICATED``) and an operator method called by a non-operator
(``PERMISSION_DENIED``), so a method added later is closed until declared. Inside a method,
:func:`caller` is the same resolution as a request's ``state`` over HTTP: its tenant scopes
the rids it names and its prompt-cache namespace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from radixserve.api.access.tenants import Caller, Tenants

# every method of the service, by who may call it: anyone (HealthCheck, as HTTP's /health:
# gateways probe it without a key), anyone with a key, or an operator; the gateway of
# --dp-size (Tenants.is_gateway) may also subscribe to KV events and flush
OPEN_METHODS = frozenset({"HealthCheck"})
TENANT_METHODS = frozenset(
    {"Generate", "Abort", "GetModelInfo", "GetServerInfo", "GetLoads", "GetTokenizer", "Embed"}
)
GATEWAY_METHODS = frozenset({"SubscribeKvEvents", "FlushCache"})


def caller(tenants: Tenants, metadata: Any) -> Caller | None:
    """The caller whose call carries ``metadata``; None when the server wants a key and the
    call has none it takes."""
    if not tenants.required:
        return Caller(None, False)
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.partition(" ")
        who = tenants.resolve(token.strip().encode()) if scheme.lower() == "bearer" else None
        if who is not None:
            return Caller(*who)
    return None


def refusal(tenants: Tenants, method: str, metadata: Any) -> tuple[grpc.StatusCode, str] | None:
    """Why a call of ``method`` with ``metadata`` is refused, or None."""
    if method in OPEN_METHODS:
        return None
    who = caller(tenants, metadata)
    if who is None:
        return grpc.StatusCode.UNAUTHENTICATED, "invalid or missing API key (authorization: Bearer)"
    if method in TENANT_METHODS or tenants.is_operator(who):
        return None
    if method in GATEWAY_METHODS and tenants.is_gateway(who):
        return None
    return grpc.StatusCode.PERMISSION_DENIED, f"{method} needs an admin API key"


class KeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, tenants: Tenants) -> None:
        self.tenants = tenants

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = str(details.method).rsplit("/", 1)[-1]
        why = refusal(self.tenants, method, details.invocation_metadata)
        if handler is None or why is None:
            return handler
        return _refusing(handler, *why)


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> Any:
    """A handler of ``handler``'s shape that ends every call with ``code``."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover (an async generator: abort raises first)

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(refuse_stream, **codec)
    return grpc.unary_unary_rpc_method_handler(refuse, **codec)
