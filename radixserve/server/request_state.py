"""What the HTTP process's :class:`~radixserve.server.tokenizer_manager.TokenizerManager` keeps of
each request it waits on (:class:`ReqState`), what it watches and tells (``Process``,
``OutputObserver``), and the errors its callers turn into HTTP statuses."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

from radixserve.runtime.io_struct import GenerateRequest
from radixserve.server.io_struct import TextOutput


class SchedulerUnavailable(RuntimeError):
    """The scheduler (or detokenizer) process is gone: HTTP 503."""


class RequestFailed(RuntimeError):
    """The scheduler refused or failed a request; ``status_code`` 400, 429 (its queue is full:
    ``--max-queued-requests``) or 500."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class ClientDisconnected(Exception):
    """The HTTP client went away while its request was running."""


class Process(Protocol):
    """What the watchdog needs of a child (``multiprocessing.Process`` fits)."""

    @property
    def exitcode(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...


class OutputObserver(Protocol):
    """Told about every output as it arrives (metrics)."""

    def on_output(self, state: ReqState, out: TextOutput, now: float) -> None: ...


@dataclass(eq=False)
class ReqState:
    """One request the HTTP process waits on: the reader task puts its outputs (or the
    exception that ends it) as ``(index, item)`` on its group's shared queue; times are
    ``time.monotonic()``."""

    request: GenerateRequest
    index: int
    queue: asyncio.Queue[tuple[int, TextOutput | Exception]]
    created: float = field(default_factory=time.monotonic)
    first_output_time: float | None = None
    last_output_time: float | None = None
    finished: bool = False
