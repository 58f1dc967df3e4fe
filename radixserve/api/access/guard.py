"""RequestGuard: the checks made on a request before any route reads or parses it.

In order, each answered in OpenAI's error shape:

1. the API key (401; ``Authorization: Bearer``, or Anthropic's ``x-api-key``), on every route
   but those declared open (``api/access/routes.py``): the
   docs and ``/openapi.json`` too, and before a byte of the body is read, so an
   unauthenticated client costs nothing. Routes declared ``query_key`` (the cache page) also
   take it as ``?api_key=``, for a browser. The key names the request's tenant
   (``api/access/tenants.py``), left in ``request.state``; the routes declared ``operator``
   want an operator (``Tenants.is_operator``; 403 otherwise);
2. the body's size (413): ``Content-Length`` over the limit is refused unread, a chunked body
   as soon as it passes the limit;
3. lone UTF-16 surrogates (``"\\ud800"`` is valid JSON but not valid Unicode: no tokenizer
   and no UTF-8 response can hold it): 400, checked once here for every field of every route.

The body it read is replayed to the app; later ``receive`` calls (disconnect detection) go to
the client's own channel.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.api.access.routes import Access, RouteFacts, RouteTable
from radixserve.api.access.tenants import Caller, Tenants
from radixserve.api.asgi import replay_body, send_json
from radixserve.api.errors import error_body

_DISCONNECTED = b"\x00disconnected"  # _read_body's answer for a body cut off (compared by identity)
# a JSON escape of a surrogate: only then can the parsed body hold a lone one
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class RequestGuard:
    def __init__(
        self, app: ASGIApp, tenants: Tenants, routes: RouteTable, max_request_bytes: int
    ) -> None:
        self.app = app
        self.tenants = tenants
        self.routes = routes
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        facts = self.routes.facts(scope.get("method", "GET"), scope["path"])
        if self.tenants.required and facts.access != Access.OPEN:
            who = (
                self._bearer(headers.get(b"authorization", b""))
                or self._api_key_header(headers)
                or self._query_key(scope, facts)
            )
            if who is None:
                await _reply(
                    send,
                    401,
                    "invalid or missing API key (send Authorization: Bearer <key>)",
                    "invalid_api_key",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
            tenant, admin = who
            tenant = self.tenants.from_header(headers) or tenant
            state = scope.setdefault("state", {})
            state.update(tenant=tenant, admin=admin)
            if facts.access == Access.OPERATOR and not self._may_operate(state, facts):
                await _reply(send, 403, "this route needs an admin API key", "admin_key_required")
                return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_request_bytes:
            await self._too_large(send)
            return
        body = await self._read_body(receive)
        if body is _DISCONNECTED:  # a cut-off body is never run, even when it parses
            return
        if body is None:
            await self._too_large(send)
            return
        if _has_lone_surrogate(body):
            await _reply(
                send,
                400,
                "the request holds a lone UTF-16 surrogate (such as \\ud800): "
                "text must be valid Unicode",
                "invalid_unicode",
            )
            return
        await self.app(scope, replay_body(body, receive), send)

    def _may_operate(self, state: dict[str, object], facts: RouteFacts) -> bool:
        view = Caller(state.get("tenant"), bool(state.get("admin")))  # type: ignore[arg-type]
        if self.tenants.is_gateway(view):
            return facts.gateway
        return self.tenants.is_operator(view)

    def _bearer(self, header: bytes) -> tuple[str, bool] | None:
        scheme, _, token = header.partition(b" ")
        return self.tenants.resolve(token.strip()) if scheme.lower() == b"bearer" else None

    def _api_key_header(self, headers: dict[bytes, bytes]) -> tuple[str, bool] | None:
        """Anthropic's clients send the key as ``x-api-key``."""
        token = headers.get(b"x-api-key")
        return self.tenants.resolve(token.strip()) if token else None

    def _query_key(self, scope: Scope, facts: RouteFacts) -> tuple[str, bool] | None:
        if scope.get("method") != "GET" or not facts.query_key:
            return None
        for value in parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key", []):
            if (who := self.tenants.resolve(value.encode())) is not None:
                return who
        return None

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, None once it passes the limit (the rest is left unread), or
        :data:`_DISCONNECTED` when the client left before sending all of it."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _DISCONNECTED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        await _reply(
            send,
            413,
            f"the request body is larger than the server's limit of {self.max_request_bytes} "
            "bytes (--max-request-bytes)",
            "request_too_large",
        )


def _has_lone_surrogate(body: bytes) -> bool:
    if not _SURROGATE_ESCAPE.search(body):
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False  # malformed or too deep: the route's parser says so
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


async def _reply(
    send: Send,
    status: int,
    message: str,
    code: str,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send_json(send, status, error_body(message, code=code), extra_headers)
