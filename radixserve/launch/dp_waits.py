"""What the ``--dp-size`` launcher waits on: free ports for its children, a worker's health,
the router's registering every worker, and the router's output passed through."""

from __future__ import annotations

import collections
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from multiprocessing.process import BaseProcess
from typing import Any


class RouterLog:
    """The router's output, passed on to ours line by line (a thread), its last lines kept
    for the message when it fails to start."""

    def __init__(self, router: subprocess.Popen[bytes], keep: int = 20) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._thread = threading.Thread(target=self._pump, args=(router,), daemon=True)
        self._thread.start()

    def _pump(self, router: subprocess.Popen[bytes]) -> None:
        assert router.stdout is not None
        for raw in router.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self._lines.append(line)
            print(line, file=sys.stderr, flush=True)

    def tail(self) -> str:
        self._thread.join(timeout=2.0)  # an exited router's last words
        return "\n".join(self._lines) or "(nothing)"


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_healthy(url: str, deadline: float, proc: BaseProcess | None = None) -> bool:
    """Poll ``url/health`` until it answers 200, the deadline passes or ``proc`` exits."""
    while time.monotonic() < deadline:
        if proc is not None and proc.exitcode is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    return False


def wait_router_ready(
    url: str,
    num_workers: int,
    deadline: float,
    router: subprocess.Popen[bytes] | None = None,
    key: str | None = None,
) -> bool:
    """Poll the router until its ``/workers`` (with ``key``, where it wants one) lists
    ``num_workers`` healthy workers and its ``/v1/models`` names a model: its ``/health``
    answers before it has registered them, and a worker can be listed healthy a moment before
    its model is (smg then answers ``/v1/models`` with an error)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    while time.monotonic() < deadline and (router is None or router.poll() is None):
        try:
            workers = _get_json(f"{url}/workers", headers).get("workers", [])
            if sum(bool(w.get("is_healthy")) for w in workers) >= num_workers:
                if _get_json(f"{url}/v1/models", headers).get("data"):
                    return True
        except (OSError, ValueError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    return False


def _get_json(url: str, headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=2) as resp:
        body = json.load(resp)
    if not isinstance(body, dict):
        raise ValueError(f"{url} answered {type(body).__name__}, not an object")
    return body
