"""The real ``radixserve serve`` in a subprocess, on a free port; always torn down (SIGTERM,
then SIGKILL of its process group)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

STARTUP_TIMEOUT_S = 90.0
MAX_CONTEXT_LEN = 1024


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    api_key: str | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)


def write_api_model(path: Path, tokenizer: object, **overrides: object) -> Path:
    """The servers' tiny random Llama (context ``MAX_CONTEXT_LEN``) with the real ChatML
    tokenizer, written to ``path`` (``overrides``: other ``write_tiny_model`` arguments, the
    context's ``max_position_embeddings`` included)."""
    from radixserve.models.tiny import write_tiny_model

    spec: dict[str, Any] = dict(
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        seed=3,
        max_position_embeddings=MAX_CONTEXT_LEN,
    )
    return write_tiny_model(path, "llama", tokenizer=tokenizer, **{**spec, **overrides})


READY_LINE = "radixserve is ready at"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    args: list[str], log_path: Path, env: dict[str, str] | None = None, api_key: str | None = None
) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "radixserve", "serve", "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log_path, api_key)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{server.log()}")
        try:
            # the launcher's ready line too, naming this URL: behind --dp-size the gateway
            # answers /health before it has registered the workers, and each worker prints a
            # ready line of its own (at its own port) before that
            healthy = httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200
            if healthy and f"{READY_LINE} {server.url}" in server.log():
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    stop_server(server)
    raise RuntimeError(f"the server did not start in {STARTUP_TIMEOUT_S} s:\n{server.log()}")


def stop_server(server: Server, timeout: float = 20.0) -> int | None:
    """SIGTERM (a clean shutdown), then SIGKILL of the whole process group; the exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)  # children left behind, if any
    except ProcessLookupError:
        pass
    if server.proc.poll() is None:
        server.proc.wait(5)
    return server.proc.returncode


@contextmanager
def serving(args: list[str], log_path: Path, api_key: str | None = None) -> Iterator[Server]:
    """A server for the ``with`` block; on leaving it, it must stop cleanly (exit 0) and its
    log must hold no traceback."""
    server = start_server(args, log_path, api_key=api_key)
    try:
        yield server
    finally:
        code = stop_server(server)
        log = server.log()
        assert code == 0, f"the server did not stop cleanly ({code}):\n{log[-4000:]}"
        assert "Traceback" not in log, log[-6000:]


def model_name(server: Server) -> str:
    resp = httpx.get(f"{server.url}/v1/models", headers=server.headers, timeout=30)
    assert resp.status_code == 200 and '"data"' in resp.text, (resp.status_code, resp.text)
    return str(resp.json()["data"][0]["id"])


def pick_stop(text: str) -> str | None:
    """A two-character stop string from inside ``text`` (no U+FFFD: a random model's text may
    hold invalid bytes), or None when the text is too short."""
    for k in range(1, len(text) - 2):
        stop = text[k : k + 2]
        if "\ufffd" not in stop and stop.strip():
            return stop
    return None


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON events of a streamed ``/generate`` response's lines."""
    for line in lines:
        if line and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def final_response(stream: Any) -> Any:
    """The response a streamed Responses call ends on (the official client's stream): its
    last event, ``response.completed`` or, cut by the length limit, ``response.incomplete``
    (OpenAI's, which the client's ``get_final_response`` does not take)."""
    events = list(stream)
    final = events[-1].response
    assert events[-1].type == f"response.{final.status}", [e.type for e in events[-3:]]
    return final


def anthropic_message(api: Any, stream: bool, **kwargs: Any) -> Any:
    """A message from ``api`` (an ``anthropic`` client's ``messages`` or ``beta.messages``):
    created whole, or with ``stream`` streamed to its end."""
    if not stream:
        return api.create(**kwargs)
    with api.stream(**kwargs) as events:
        return events.get_final_message()


def prompt_tokens(message: Any) -> int:
    """The whole prompt of an Anthropic message: its input tokens, the cached ones included
    (``cache_read_input_tokens``, which ``input_tokens`` leaves out)."""
    return int(message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0))


@contextmanager
def paused(client: httpx.Client, mode: str = "in_place") -> Iterator[None]:
    """The server paused in ``mode`` (``/pause_generation``) for the ``with`` block: requests
    sent meanwhile wait. It continues on leaving the block, whatever the block raised."""
    resp = client.post("/pause_generation", json={"mode": mode})
    assert resp.status_code == 200, resp.text
    try:
        yield
    finally:
        resp = client.post("/continue_generation")
        assert resp.status_code == 200, resp.text


@contextmanager
def paused_while_running(
    client: httpx.Client, body: dict[str, Any], attempts: int = 5
) -> Iterator[Iterator[dict[str, Any]]]:
    """A streamed ``/generate`` of ``body`` caught running: after its first event the server
    pauses in place, and the ``with`` block gets its remaining events while the request holds
    its KV and nothing steps. A request that ended before the pause landed (the machine busy) is
    sent again, up to ``attempts`` times: no test depends on winning that race. The server
    continues on leaving the block."""
    for _ in range(attempts):
        with client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
            events = sse_events(resp.iter_lines())
            next(events)
            with paused(client):
                info = client.get("/get_server_info").json()
                if info["scheduler"]["num_running_reqs"] == 1:
                    yield events
                    return
            list(events)  # it had finished: let it end, then try again
    raise AssertionError(f"no request of {body} was still running {attempts} times in a row")
