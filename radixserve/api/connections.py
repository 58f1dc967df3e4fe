"""Bounded connections (issue #28, item 3): idle connections cannot lock the server out.

Clients that open TCP connections and send nothing used to hold the HTTP process at its
file-descriptor limit: ``/health`` timed out while they were held, and every failed ``accept``
logged a traceback. :func:`guarded_protocol` makes uvicorn's h11 protocol class that

- closes a connection that has not sent a whole request head within ``header_timeout_s``
  (uvicorn's own keep-alive timeout covers the time between requests);
- keeps at most ``max_connections`` open (by default the descriptor limit less a reserve for
  the process's own files and sockets and less the listen backlog): past it, a new connection closes the connection that
  has been idle longest (no request in progress: new, or between keep-alive requests), so a
  client that sends a request gets in; when none is idle, the new one is closed at once;

and :func:`throttle_accept_errors` logs ``accept()`` failures once per interval with a count.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

FD_RESERVE = 128  # descriptors kept for the process's own files, pipes and zmq sockets
ACCEPT_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float = 10.0
    # the listen backlog, which is also how many connections asyncio accepts in one go before
    # any is closed: the cap leaves that many descriptors free, so accept() never runs out
    # (out of descriptors, asyncio stops accepting for a second, and /health waits with the rest)
    backlog: int = 512

    @classmethod
    def default(cls, max_connections: int | None, header_timeout_s: float) -> ConnectionLimits:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        backlog = max(16, min(512, soft // 4))
        if max_connections is None:
            max_connections = max(16, soft - FD_RESERVE - backlog)
        return cls(max_connections, header_timeout_s, backlog)


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol under ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""

    class GuardedH11Protocol(H11Protocol):
        _idle_since: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            idle = _idle(self.server_state)
            if len(self.connections) > limits.max_connections:
                if not idle:  # every connection is serving a request: refuse this one
                    self.transport.close()
                    return
                oldest, _ = idle.popitem(last=False)
                oldest.transport.close()
            idle[self] = None
            self._idle_since = self.loop.call_later(limits.header_timeout_s, self._header_late)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._busy()  # a whole request head arrived: it is being served

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                _idle(self.server_state)[self] = None  # idle until its next request

        def connection_lost(self, exc: Exception | None) -> None:
            self._busy()
            super().connection_lost(exc)

        def _busy(self) -> None:
            _idle(self.server_state).pop(self, None)
            if self._idle_since is not None:
                self._idle_since.cancel()
                self._idle_since = None

        def _header_late(self) -> None:
            self._idle_since = None
            if self.cycle is None:  # nothing but (part of) a request head in all this time
                _idle(self.server_state).pop(self, None)
                self.transport.close()

    return GuardedH11Protocol


def _idle(server_state: Any) -> OrderedDict[Any, None]:
    """The server's idle connections, the longest idle first (kept on uvicorn's state)."""
    idle = getattr(server_state, "radixserve_idle", None)
    if idle is None:
        idle = server_state.radixserve_idle = OrderedDict()
    return idle


def throttle_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log the loop's ``accept()`` failures (out of descriptors, ...) once per interval, with how
    many there were, instead of a traceback each; other errors go to the default handler."""
    state = {"last": 0.0, "count": 0}

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "accept" not in str(context.get("message", "")):
            loop.default_exception_handler(context)
            return
        state["count"] += 1
        now = time.monotonic()
        if now - state["last"] >= ACCEPT_LOG_INTERVAL_S:
            logger.warning(
                "accept() failed %d times in the last %.0f s (%s): too many open connections?",
                state["count"],
                ACCEPT_LOG_INTERVAL_S,
                context.get("exception"),
            )
            state["last"], state["count"] = now, 0

    loop.set_exception_handler(handler)
