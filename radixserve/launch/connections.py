"""Bounded connections: idle or slow clients cannot lock the server out.

Clients that open TCP connections and send nothing, or send a request head and then its body a
byte at a time, would otherwise hold the HTTP process at its file-descriptor limit or its
connection cap, and new clients could not get in. :func:`guarded_protocol` makes uvicorn's h11
protocol class that

- closes a connection that has not sent a whole request head within ``header_timeout_s``
  (uvicorn's own keep-alive timeout covers the time between requests);
- answers 408 (OpenAI's error shape; only when no response has started) and closes a connection
  whose request body has not all arrived within ``body_timeout_s`` of its head, or that has
  fallen below ``min_body_rate`` bytes/s once ``body_rate_grace_s`` has passed (it may take
  ``body_rate_grace_s + received / min_body_rate`` seconds, Apache mod_reqtimeout's MinRate).
  Only receiving the request body is timed: a response streams for as long as it takes;
- keeps at most ``max_connections`` open (by default the descriptor limit less a reserve for
  the process's own files and sockets and less the listen backlog): past it, a new connection
  closes the connection that has been idle longest (no request in progress: new, or between
  keep-alive requests) or, when none is idle, the one that has been receiving its request body
  longest (answered 408 as above), so a client that sends a request gets in; when every
  connection is being served, the new one is closed at once;

and :func:`throttle_accept_errors` logs ``accept()`` failures once per interval with a count.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from radixserve.api.errors import error_body

logger = logging.getLogger(__name__)

FD_RESERVE = 128  # descriptors kept for the process's own files, pipes and zmq sockets
ACCEPT_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    min_body_rate: float = 500.0  # bytes/s; 0: no minimum
    body_rate_grace_s: float = 10.0
    # the listen backlog, which is also how many connections asyncio accepts in one go before
    # any is closed: the cap leaves that many descriptors free, so accept() never runs out
    # (out of descriptors, asyncio stops accepting for a second, and /health waits with the rest)
    backlog: int = 512

    @classmethod
    def default(
        cls,
        max_connections: int | None,
        header_timeout_s: float,
        body_timeout_s: float = 30.0,
        min_body_rate: float = 500.0,
    ) -> ConnectionLimits:
        """Limits for this process's descriptor limit; a body gets as long as a head to get
        going before the minimum rate applies."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        backlog = max(16, min(512, soft // 4))
        if max_connections is None:
            max_connections = max(16, soft - FD_RESERVE - backlog)
        return cls(
            max_connections,
            header_timeout_s,
            body_timeout_s,
            min_body_rate,
            body_rate_grace_s=header_timeout_s,
            backlog=backlog,
        )


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol under ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""

    class GuardedH11Protocol(H11Protocol):
        _idle_since: asyncio.TimerHandle | None = None
        # the request whose body is arriving: when its head came, how many bytes since
        _body_cycle: RequestResponseCycle | None = None
        _body_start = 0.0
        _body_bytes = 0
        _body_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            idle = _idle(self.server_state)
            if len(self.connections) > limits.max_connections:
                receiving = _receiving(self.server_state)
                if idle:
                    oldest, _ = idle.popitem(last=False)
                    oldest.transport.close()
                elif receiving:
                    next(iter(receiving))._cut()
                else:  # every connection is serving a request: refuse this one
                    self.transport.close()
                    return
            idle[self] = None
            self._idle_since = self.loop.call_later(limits.header_timeout_s, self._header_late)

        def data_received(self, data: bytes) -> None:
            counting = self._body_cycle is not None
            super().data_received(data)
            if counting:
                self._body_bytes += len(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._busy()  # a whole request head arrived: it is being served
            self._watch_body()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self.cycle.response_complete:
                _idle(self.server_state)[self] = None  # idle until its next request
            else:  # a pipelined request was waiting: it is being served now
                self._watch_body()

        def connection_lost(self, exc: Exception | None) -> None:
            self._busy()
            self._body_done()
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

        def _watch_body(self) -> None:
            """Times the current request's body from its head while it is arriving."""
            cycle = self.cycle
            if cycle is None or self.conn.their_state is not h11.SEND_BODY:
                self._body_done()
                return
            if cycle is self._body_cycle:
                return
            self._body_done()
            # the body bytes that came with the head are already in the cycle
            self._body_cycle, self._body_start, self._body_bytes = (
                cycle,
                self.loop.time(),
                len(cycle.body),
            )
            _receiving(self.server_state)[self] = None
            self._body_timer = self.loop.call_at(self._body_deadline()[0], self._body_check)

        def _body_deadline(self) -> tuple[float, str]:
            """When the body is late, and which flag that breaks."""
            end = self._body_start + limits.body_timeout_s
            if limits.min_body_rate > 0:
                slow = self._body_start + limits.body_rate_grace_s
                slow += self._body_bytes / limits.min_body_rate
                if slow < end:
                    return slow, (
                        f"the request body arrived slower than {limits.min_body_rate:g} bytes/s "
                        "(--min-request-body-rate)"
                    )
            return end, (
                f"the request body did not arrive within {limits.body_timeout_s:g} s of its "
                "head (--request-body-timeout)"
            )

        def _body_check(self) -> None:
            self._body_timer = None
            if self._body_cycle is None:
                return
            deadline, reason = self._body_deadline()
            now = self.loop.time()
            if self.flow.read_paused:  # the server, not the client, holds the body up
                deadline = now + 1.0
            if now < deadline:
                self._body_timer = self.loop.call_at(deadline, self._body_check)
                return
            self._cut(reason)

        def _cut(self, reason: str = "the server is at its connection limit") -> None:
            """Answers 408 unless a response has started, and closes the connection; the
            request sees a client that left."""
            cycle = self._body_cycle
            self._body_done()
            if cycle is not None and not cycle.response_started and not cycle.disconnected:
                cycle.disconnected = True  # the app's reply (if any) goes nowhere
                cycle.message_event.set()
                try:
                    self.transport.write(_timeout_response(self.conn, reason))
                except h11.LocalProtocolError:
                    pass  # h11 will not send a response in its state: just close
            self.transport.close()

        def _body_done(self) -> None:
            _receiving(self.server_state).pop(self, None)
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            self._body_cycle = None

    return GuardedH11Protocol


def _timeout_response(conn: h11.Connection, reason: str) -> bytes:
    """A whole 408 response with an OpenAI-shaped error, the connection closing after it."""
    body = json.dumps(error_body(reason, code="request_timeout")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    out = conn.send(h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"))
    out = (out or b"") + (conn.send(h11.Data(data=body)) or b"")
    return out + (conn.send(h11.EndOfMessage()) or b"")


def _receiving(server_state: Any) -> OrderedDict[Any, None]:
    """The server's connections receiving a request body, the longest receiving first."""
    receiving = getattr(server_state, "radixserve_receiving", None)
    if receiving is None:
        receiving = server_state.radixserve_receiving = OrderedDict()
    return receiving


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
