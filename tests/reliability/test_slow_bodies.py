"""Slow request bodies cannot lock clients out. The server keeps at most ``CAP`` connections;
a body must arrive within ``--request-body-timeout`` of its head and, after the first
``--request-header-timeout`` seconds, keep up with ``--min-request-body-rate``; a connection
that breaks either is answered 408 (OpenAI's error shape) and closed. At the cap, a connection
still receiving its body gives way to a new client."""

from __future__ import annotations

import json
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reliability_harness import server_args
from serving_harness import Server, serving

pytestmark = pytest.mark.timeout(180)

CAP = 8
HEADER_TIMEOUT_S = 2  # also the grace before the minimum rate applies
BODY_TIMEOUT_S = 5
MIN_RATE = 1  # bytes/s: a byte a second keeps up with it, a body that stalls does not
SLOW = 3 * CAP
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n"
)


@pytest.fixture(scope="module")
def slow_server(rel_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("slow-bodies") / "server.log"
    args = server_args(rel_model_dir, "--max-connections", str(CAP))
    args += ["--request-header-timeout", str(HEADER_TIMEOUT_S)]
    args += ["--request-body-timeout", str(BODY_TIMEOUT_S)]
    args += ["--min-request-body-rate", str(MIN_RATE)]
    with serving(args, log) as srv:
        yield srv


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


class Trickle:
    """Slow-body clients: each sends a request head and then one body byte a second, and
    records what the server answers until it closes the connection."""

    def __init__(self, port: int, n: int) -> None:
        self.socks: list[socket.socket] = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                s.sendall(HEAD)
            except OSError:
                pass  # closed at once (a full server): it reads as closed below
            self.socks.append(s)
        self.answers = {s: b"" for s in self.socks}
        self.open = set(self.socks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_byte = time.monotonic()
        while not self._stop.is_set() and self.open:
            wait = max(0.0, next_byte - time.monotonic())
            readable, _, _ = select.select(list(self.open), [], [], wait)
            for s in readable:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                self.answers[s] += data
                if not data:
                    self.open.discard(s)
            if time.monotonic() >= next_byte:
                next_byte += 1.0
                for s in list(self.open):
                    if self.answers[s]:
                        continue  # answered: the server is closing it
                    try:
                        s.send(b" ")
                    except OSError:
                        self.open.discard(s)

    def wait_closed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.open and time.monotonic() < deadline:
            time.sleep(0.1)
        return not self.open

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for s in self.socks:
            s.close()


def _health_s(url: str) -> float:
    start = time.perf_counter()
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    return time.perf_counter() - start


def test_slow_bodies_do_not_lock_clients_out(slow_server: Server) -> None:
    baseline = statistics.median(_health_s(slow_server.url) for _ in range(3))
    slow = Trickle(_port(slow_server), SLOW)
    try:
        # every slot holds a slow body now: a new client still gets in, at about the usual pace
        assert _health_s(slow_server.url) < max(2.0, 20 * baseline)
        body = {"prompt": "hello", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{slow_server.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert slow.wait_closed(BODY_TIMEOUT_S + 15), f"{len(slow.open)} slow bodies still open"
        answers = [a for a in slow.answers.values() if a]
        assert answers, "no slow body was answered"
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]
    finally:
        slow.close()
    assert _health_s(slow_server.url) < max(2.0, 20 * baseline)


def test_a_stalled_body_is_answered_408_and_closed(slow_server: Server) -> None:
    with socket.create_connection(("127.0.0.1", _port(slow_server)), timeout=15) as s:
        s.sendall(HEAD)  # and no body: below the minimum rate once the grace ends
        start = time.monotonic()
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        elapsed = time.monotonic() - start
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in head.lower()
    error = json.loads(payload)["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert "--min-request-body-rate" in error["message"]
    # cut by the rate at the end of the grace, well before the body timeout
    assert HEADER_TIMEOUT_S - 0.5 < elapsed < BODY_TIMEOUT_S - 0.5, elapsed
