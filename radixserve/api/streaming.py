"""Serving helpers shared by the routes: opening requests, merging their outputs, SSE.

:func:`open_requests` sends a group of requests (a batch, or the ``n`` choices of one prompt)
and waits for each one's first output before the HTTP response starts, so a request the
scheduler refuses is a plain 4xx instead of an error inside a 200 stream. The returned
:class:`OpenRequests` must be closed (``aclose``): that aborts whatever has not finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.server.io_struct import TextOutput
from radixserve.server.tokenizer_manager import TokenizerManager
from radixserve.types import FinishReason

T = TypeVar("T")
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


async def gather_or_cancel(coros: list[Awaitable[T]]) -> list[T]:
    """``asyncio.gather`` that cancels the others when one fails."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass(eq=False)
class RequestResult:
    """Everything one request produced so far."""

    request: GenerateRequest
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] | None = None
    last: ReqOutput | None = None

    def add(self, out: TextOutput) -> None:
        o = out.output
        self.text += out.text
        self.output_ids.extend(o.new_token_ids)
        self.logprobs.extend(o.new_logprobs)
        self.top_logprobs.extend(o.new_top_logprobs)
        if o.input_logprobs is not None:
            self.input_logprobs = list(o.input_logprobs)
        self.last = o

    @property
    def finish_reason(self) -> FinishReason | None:
        return None if self.last is None else self.last.finish_reason

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.input_ids)

    @property
    def completion_tokens(self) -> int:
        return 0 if self.last is None else self.last.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return 0 if self.last is None else self.last.cached_tokens


class OpenRequests:
    """A group of running requests; iterate ``events()`` for (index, output) as they come."""

    def __init__(self, stack: contextlib.AsyncExitStack, streams: list[AsyncIterator[TextOutput]]):
        self._stack = stack
        self._streams = streams
        self._firsts: list[TextOutput] = []

    async def peek(self) -> None:
        """Wait for the first output of every request (a refused one raises here)."""
        self._firsts = await gather_or_cancel([s.__anext__() for s in self._streams])

    async def events(self) -> AsyncIterator[tuple[int, TextOutput]]:
        """Every output of every request, in arrival order per request, each once."""
        queue: asyncio.Queue[tuple[int, TextOutput | BaseException | None]] = asyncio.Queue()

        async def pump(i: int, first: TextOutput, rest: AsyncIterator[TextOutput]) -> None:
            try:
                await queue.put((i, first))
                async for out in rest:
                    await queue.put((i, out))
                await queue.put((i, None))
            except BaseException as exc:
                await queue.put((i, exc))
                raise

        tasks = [
            asyncio.ensure_future(pump(i, f, s))
            for i, (f, s) in enumerate(zip(self._firsts, self._streams, strict=True))
        ]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

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
        streams = [await stack.enter_async_context(tm.stream(r, is_disconnected)) for r in requests]
        group = OpenRequests(stack, streams)
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
