"""Frontend fixtures: a tiny model, the in-process ``Runtime`` on it, and a real
``radixserve serve`` subprocess on a free port with a ``RuntimeEndpoint`` to it.

``backend`` is parametrized over both, so each program test runs on each. The oracle engine
is the Runtime's own Engine: the server loads the same checkpoint (float32 both).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

SERVER_STARTUP_TIMEOUT_S = 120.0
MAX_TOTAL_TOKENS = 32768


@pytest.fixture(scope="session")
def fe_model_dir(tiny_llama_dir: Path) -> Path:
    return tiny_llama_dir


@pytest.fixture(scope="session")
def fe_runtime(fe_model_dir: Path) -> Iterator[Any]:
    from radixserve.frontend import Runtime

    runtime = Runtime(str(fe_model_dir), dtype="float32", max_total_tokens=MAX_TOTAL_TOKENS)
    yield runtime
    runtime.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def fe_server_url(fe_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``radixserve serve`` in its own process group; SIGTERM, then SIGKILL of the group."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("frontend-server") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "radixserve",
        "serve",
        "--model",
        str(fe_model_dir),
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-total-tokens",
        str(MAX_TOTAL_TOKENS),
        "--log-level",
        "warning",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log_path)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(5)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the server did not start in time:\n{log_path.read_text()}")


@pytest.fixture(scope="session")
def fe_endpoint(fe_server_url: str) -> Iterator[Any]:
    from radixserve.frontend import RuntimeEndpoint

    endpoint = RuntimeEndpoint(fe_server_url, timeout=60.0)
    yield endpoint
    endpoint.shutdown()


@pytest.fixture(params=["runtime", "endpoint"])
def backend(request: pytest.FixtureRequest) -> Any:
    """Each program test runs on the in-process Runtime and on the HTTP RuntimeEndpoint."""
    return request.getfixturevalue(f"fe_{request.param}")


@pytest.fixture(scope="session")
def oracle_engine(fe_runtime: Any) -> Any:
    """The Engine the oracles compute with directly (the same checkpoint as the server's)."""
    return fe_runtime.engine
