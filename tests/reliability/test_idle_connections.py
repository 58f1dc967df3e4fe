"""Connections that send nothing cannot lock the server out. The server runs under a
descriptor limit of 512 (so its connection cap is 256, its backlog 128); the test holds 2,000 idle
connections (more than the limit) and /health and a completion still answer at once, the log
stays small, and a slow request head is cut at the header timeout."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serving_harness import free_port

pytestmark = pytest.mark.timeout(180)

FD_LIMIT = 512
IDLE = 2000


@pytest.fixture(scope="module")
def limited_server(rel_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    log = tmp_path_factory.mktemp("limited") / "server.log"
    serve = [sys.executable, "-m", "radixserve", "serve", "--model", str(rel_model_dir)]
    serve += ["--port", str(port), "--request-header-timeout", "2"]
    cmd = ["bash", "-c", f'ulimit -n {FD_LIMIT} && exec "$@"', "serve", *serve]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.3)
        yield url, port, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            pass  # refused or reset while the server sheds idle connections: fine
    return socks


def _health_s(url: str, n: int = 5) -> list[float]:
    latencies = []
    for _ in range(n):
        start = time.perf_counter()
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        latencies.append(time.perf_counter() - start)
    return latencies


def test_idle_connections_do_not_lock_the_server_out(limited_server) -> None:
    url, port, log = limited_server
    baseline = statistics.median(_health_s(url))  # this machine's pace right now
    socks = _open_idle(port, IDLE)
    try:
        # out of descriptors, asyncio stops accepting for a second at a time: /health takes seconds
        latencies = _health_s(url)
        assert statistics.median(latencies) < max(0.5, 5 * baseline), (baseline, latencies)
        body = {"prompt": "hello", "max_tokens": 4, "temperature": 0}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
    finally:
        for s in socks:
            s.close()
    assert log.stat().st_size < 200_000, "the log grew with the idle connections"
    assert "Traceback" not in log.read_text()


def test_a_request_head_that_never_ends_is_cut(limited_server) -> None:
    url, port, _ = limited_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        start = time.monotonic()
        s.settimeout(10)
        assert s.recv(1024) == b""  # closed by the server
        assert 1.0 < time.monotonic() - start < 6.0
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
