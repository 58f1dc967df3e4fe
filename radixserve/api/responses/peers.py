"""Stored responses, conversations and Anthropic's threads over data-parallel workers
(``--dp-size`` with HTTP workers): each worker keeps what it stored, the gateway sends a request
to any worker, so a chained turn (``previous_response_id``), a turn in a conversation or a
thread, or a ``GET`` of a response or conversation could reach one that does not hold it.

Here an id names its worker (``resp_w1_...``, ``conv_w0_...``, ``msg_w1_...``), and a request that names
another worker's object is forwarded to that worker as it came (its key too: the owner checks
it, so one tenant's objects stay its own) and its answer streamed back. The owner also holds
the conversation's prefix in its radix cache, so a forwarded turn is a cache hit where another
worker would prefill it all. A request forwarded once is served where it lands. A single server
has no peers: its ids name no worker and nothing is forwarded.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.api.asgi import replay_body, send_json
from radixserve.api.errors import error_body

FORWARDED = b"x-radixserve-forwarded"  # a request a worker forwarded: not forwarded again
_OWNED = re.compile(r"^(?:resp|conv|msg)_w(\d{1,4})_")
_BY_PATH = re.compile(r"^/v1/(?:responses|conversations)/([^/]+)")
_BY_BODY = (
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/responses/compact",
    "/v1/messages",  # Anthropic's: a thread's next turn
)  # POSTs naming what they go on from
_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive"}


@dataclass(frozen=True, slots=True)
class StatePeers:
    """Every worker's URL (empty: a single server) and this worker's place among them."""

    urls: tuple[str, ...] = ()
    rank: int = 0

    def new_id(self, prefix: str) -> str:
        """A new object's id, naming this worker where there are peers."""
        own = f"w{self.rank}_" if self.urls else ""
        return f"{prefix}_{own}{uuid.uuid4().hex[:24]}"

    def owner(self, object_id: Any) -> str | None:
        """The URL of the other worker that holds ``object_id`` (None: this one, or none)."""
        found = _OWNED.match(object_id) if isinstance(object_id, str) and self.urls else None
        if found is None:
            return None
        rank = int(found.group(1))
        return self.urls[rank] if rank != self.rank and rank < len(self.urls) else None


class ForwardToOwner:
    """The ASGI layer that sends a request naming another worker's object there."""

    def __init__(
        self, app: ASGIApp, peers: StatePeers, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.app = app
        self.peers = peers
        self._transport = transport  # None: the network (a test hands in an app's)
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.peers.urls or _header(scope, FORWARDED):
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope.get("method", "GET")
        by_path = _BY_PATH.match(path)
        if method == "POST" and path in _BY_BODY:
            body = await _read(receive)
            owner = self.peers.owner(_named(body))
        elif by_path is not None and (owner := self.peers.owner(by_path.group(1))):
            body = await _read(receive)
        else:
            await self.app(scope, receive, send)
            return
        if owner is None:
            await self.app(scope, replay_body(body, receive), send)
            return
        await self._forward(owner, scope, body, receive, send)

    async def _forward(
        self, owner: str, scope: Scope, body: bytes, receive: Receive, send: Send
    ) -> None:
        if self._client is None:
            timeout = httpx.Timeout(None, connect=5.0)  # an answer may take minutes
            # as many at once as clients send (the server's own connection bound holds them;
            # httpx's default of 100 would queue the rest behind long streams)
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
            self._client = httpx.AsyncClient(
                timeout=timeout, limits=limits, transport=self._transport
            )
        query = scope.get("query_string", b"").decode("latin-1")
        url = owner + scope["path"] + (f"?{query}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        headers.append((FORWARDED, b"1"))
        request = self._client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            upstream = await self._client.send(request, stream=True)
        except httpx.HTTPError:
            why = "the worker that holds this object is not reachable"
            await send_json(send, 503, error_body(why, "service_unavailable", code=503))
            return
        left = asyncio.ensure_future(_disconnected(receive))
        try:
            kept = [(k, v) for k, v in upstream.headers.raw if k.lower() not in _HOP]
            await send(
                {"type": "http.response.start", "status": upstream.status_code, "headers": kept}
            )
            chunks = upstream.aiter_raw()
            while True:  # each piece as it comes, unless the client leaves first
                piece = asyncio.ensure_future(anext(chunks, None))
                await asyncio.wait((piece, left), return_when=asyncio.FIRST_COMPLETED)
                if not piece.done():  # the client left: closing the stream aborts it there
                    piece.cancel()
                    break
                if (chunk := piece.result()) is None:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError:  # the owner went away mid-answer: the client's stream ends
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            left.cancel()
            await upstream.aclose()


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k.lower() == name), None)


def _named(body: bytes) -> Any:
    """The stored response, conversation or Anthropic thread a create names (None: none, or
    no JSON)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    conversation = data.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    thread = data.get("thread")
    following = thread.get("previous_message_id") if isinstance(thread, dict) else None
    return data.get("previous_response_id") or conversation or following


async def _read(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
