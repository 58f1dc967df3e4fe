"""Serving helpers shared by the routes: opening requests, merging their outputs, SSE.

:func:`open_requests` sends a group of requests (a batch, or the ``n`` choices of one prompt)
and waits for each one's first output before the HTTP response starts, so a request the
scheduler refuses is a plain 4xx instead of an error inside a 200 stream. The returned
:class:`OpenRequests` must be closed (``aclose``): that aborts whatever has not finished.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixserve.api.errors import APIError, error_body, to_api_error
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.io_struct import TextOutput
from radixserve.server.request_state import ClientDisconnected
from radixserve.server.result import RequestResult
from radixserve.server.tokenizer_manager import TokenizerManager

SSE_DONE = "data: [DONE]\n\n"


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` response that always closes its body iterator and then calls
    ``on_close``, however the response ends (done, client gone, error, never started)."""

    media_type = "text/event-stream"

    def __init__(
        self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._body = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self._body.aclose()  # type: ignore[attr-defined]
            if self._on_close is not None:
                await self._on_close()


def openai_error_event(err: APIError) -> str:
    """An error inside a stream as OpenAI's clients read it: one event of the error shape."""
    return sse(error_body(err.message, err.type, err.param, err.status_code))


def event_stream(
    group: OpenRequests,
    events: AsyncIterator[str],
    error_event: Callable[[APIError], str] = openai_error_event,
    done: str | None = SSE_DONE,
) -> SSEResponse:
    """The one stream lifecycle of every door: the protocol's ``events`` (its renderer over
    ``group``), then ``done``; a client that left ends it quietly; an exception becomes one
    ``error_event`` (then ``done``); ``group`` is closed however the response ends."""

    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        except ClientDisconnected:
            return
        except Exception as exc:
            yield error_event(to_api_error(exc))
        if done is not None:
            yield done

    return SSEResponse(body(), on_close=group.aclose)


class OpenRequests:
    """A group of running requests (one HTTP request's), read through one iterator of
    ``(index, output)``: one waiter however many requests."""

    def __init__(
        self,
        stack: contextlib.AsyncExitStack,
        outputs: AsyncIterator[tuple[int, TextOutput]],
        size: int,
    ) -> None:
        self._stack = stack
        self._outputs = outputs
        self._size = size
        self._peeked: list[tuple[int, TextOutput]] = []

    async def peek(self) -> None:
        """Wait for the first output of every request (a refused one raises here); what
        arrives meanwhile is kept for ``events()``."""
        seen: set[int] = set()
        while len(seen) < self._size:
            i, out = await self._outputs.__anext__()
            seen.add(i)
            self._peeked.append((i, out))

    async def events(self) -> AsyncIterator[tuple[int, TextOutput]]:
        """Every output of every request, in arrival order per request, each once."""
        peeked, self._peeked = self._peeked, []
        for event in peeked:
            yield event
        async for event in self._outputs:
            yield event

    async def aclose(self) -> None:
        await self._stack.aclose()


async def open_requests(
    tm: TokenizerManager,
    requests: list[GenerateRequest],
    is_disconnected: Callable[[], Awaitable[bool]] | None,
) -> OpenRequests:
    """Send ``requests`` and wait for the first output of each (errors raise here)."""
    stack = contextlib.AsyncExitStack()
    try:
        outputs = await stack.enter_async_context(tm.stream(requests, is_disconnected))
        group = OpenRequests(stack, outputs, len(requests))
        await group.peek()
        return group
    except BaseException:
        await stack.aclose()
        raise


async def collect_all(group: OpenRequests, requests: list[GenerateRequest]) -> list[RequestResult]:
    """Run every request of ``group`` to its end; results in request order."""
    results = [RequestResult(r) for r in requests]
    try:
        async for i, out in group.events():
            results[i].add(out)
    finally:
        await group.aclose()
    return results
