"""A ``radixserve serve`` subprocess on a free port, for the HTTP and frontend drivers.

Started and stopped around one system's run, so two servers never compete for the cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import IO

import httpx

STARTUP_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def launched_server(
    model_path: str,
    dtype: str,
    policy: str,
    disable_radix_cache: bool,
    num_threads: int | None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """Yields the server's URL; the server (its whole process group) is stopped on exit.
    ``extra_args``: more ``radixserve serve`` flags (``--dp-size`` ...)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "radixserve",
        "serve",
        "--model",
        model_path,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--schedule-policy",
        policy,
        "--log-level",
        "warning",
    ]
    if disable_radix_cache:
        cmd.append("--disable-radix-cache")
    cmd += extra_args
    env = dict(os.environ)
    if num_threads is not None:
        env["RADIXSERVE_NUM_THREADS"] = str(num_threads)  # read by radixserve.config
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, log)
            yield url
        finally:
            _stop(proc)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"the server did not start in {STARTUP_TIMEOUT_S} s:\n{_tail(log)}")


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-4000:]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # children left behind, if any
    proc.wait()
