"""What the three server processes share: socket addresses, zmq helpers, parent watching.

Sockets (pyzmq IPC, pickled lists of :mod:`radixserve.runtime.io_struct` messages)::

    HTTP process       PUSH --> scheduler_in   (PULL, scheduler process)
    scheduler process  PUSH --> detokenizer_in (PULL, detokenizer process)
    detokenizer        PUSH --> tokenizer_in   (PULL, HTTP process)

The receiving end binds, the sending end connects, so either side may start first.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

import zmq

LOG_FORMAT = "%(asctime)s %(levelname)s [%(processName)s] %(name)s: %(message)s"


@dataclass(frozen=True, slots=True)
class IpcEndpoints:
    scheduler_in: str
    detokenizer_in: str
    tokenizer_in: str

    @classmethod
    def in_dir(cls, directory: str | Path) -> IpcEndpoints:
        d = Path(directory)
        return cls(
            scheduler_in=f"ipc://{d / 'scheduler_in'}",
            detokenizer_in=f"ipc://{d / 'detokenizer_in'}",
            tokenizer_in=f"ipc://{d / 'tokenizer_in'}",
        )

    def remove_dir(self) -> None:
        """Remove the sockets' directory: what an orphaned child does, since the parent that
        would have is gone."""
        path = self.scheduler_in.removeprefix("ipc://")
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def make_socket(context: zmq.Context, kind: int, endpoint: str, bind: bool) -> zmq.Socket:
    """A PUSH or PULL socket with unbounded queues (back pressure is the scheduler's job) and no
    linger (a dying process must not hang on unsent messages)."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    return sock


def recv_all(sock: zmq.Socket, timeout_ms: int) -> list[object]:
    """Every message waiting on ``sock``, each a pickled list, flattened in order; waits up to
    ``timeout_ms`` for the first (0: do not wait)."""
    msgs: list[object] = []
    if timeout_ms > 0 and not sock.poll(timeout_ms):
        return msgs
    while True:
        try:
            batch = sock.recv_pyobj(zmq.NOBLOCK)
        except zmq.Again:
            return msgs
        msgs.extend(batch if isinstance(batch, list) else [batch])


class ParentWatch:
    """Tells a child process that the process that started it is gone (killed with SIGKILL, so
    it could not stop its children): then the child exits instead of living on as an orphan."""

    def __init__(self, parent_pid: int, interval_s: float = 1.0) -> None:
        self.parent_pid = parent_pid
        self.interval_s = interval_s
        self._last = time.monotonic()

    def parent_gone(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return os.getppid() != self.parent_pid


def setup_child_process(level: str) -> None:
    """Logging, and signals: the child leaves the terminal's process group, so Ctrl-C and group
    signals reach only the parent, which then stops its children in order; SIGTERM (from the
    parent) exits through ``SystemExit`` so cleanup handlers run."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # tqdm (progress bars while loading weights) would otherwise make a multiprocessing lock,
    # whose named semaphore exit_process() cannot release
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def exit_process(code: int) -> NoReturn:
    """End a child process now: its cleanup is done, and the interpreter's own teardown with
    torch loaded takes seconds for nothing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
