"""One server with --api-key: authentication on every route but /health; then its scheduler is
killed: pending and new requests fail with 503 (never hang), the log says why, and the server
still stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_harness import Server, start_server, stop_server

API_KEY = "sk-test-secret"


@pytest.fixture(scope="module")
def keyed_server(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("keyed-log") / "server.log"
    srv = start_server(
        ["--model", str(api_model_dir), "--max-total-tokens", "8192"], log, api_key=API_KEY
    )
    try:
        yield srv
    finally:
        code = stop_server(srv)
        assert code == 0, f"the server did not stop cleanly ({code}):\n{srv.log()[-4000:]}"


@pytest.mark.parametrize(
    "method,route",
    [
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/generate"),
        ("GET", "/metrics"),
        ("GET", "/get_server_info"),
        ("GET", "/get_model_info"),
        ("POST", "/flush_cache"),
        ("POST", "/abort_request"),
    ],
)
def test_routes_need_the_key(keyed_server: Server, method: str, route: str) -> None:
    url = keyed_server.url + route
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        resp = httpx.request(method, url, headers=headers, json={})
        assert resp.status_code == 401, (route, headers, resp.text)
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "invalid_api_key"


def test_health_needs_no_key_and_the_key_works(keyed_server: Server) -> None:
    import openai

    assert httpx.get(keyed_server.url + "/health").status_code == 200
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=API_KEY, max_retries=0)
    resp = client.completions.create(model="tiny-llama", prompt="hi", max_tokens=2)
    assert resp.usage.completion_tokens <= 2
    bad = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_scheduler_death_gives_503_not_a_hang(keyed_server: Server) -> None:
    with keyed_server.client(timeout=30) as client:
        pids = client.get("/get_server_info").json()["pids"]
        results: dict[str, Any] = {}

        def non_stream() -> None:
            body = {"text": "x", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
            with keyed_server.client(timeout=30) as c:
                resp = c.post("/generate", json=body)
                results["non_stream"] = (resp.status_code, resp.json())

        def stream() -> None:
            body = {
                "prompt": "y",
                "max_tokens": 900,
                "stream": True,
                "ignore_eos": True,
            }
            with keyed_server.client(timeout=30) as c:
                with c.stream("POST", "/v1/completions", json=body) as resp:
                    lines = [line for line in resp.iter_lines() if line]
                results["stream"] = (resp.status_code, lines)

        threads = [threading.Thread(target=non_stream), threading.Thread(target=stream)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # both are generating now
        os.kill(pids["scheduler"], signal.SIGKILL)
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a request hung after the scheduler died"

        status, body = results["non_stream"]
        assert status == 503 and body["error"]["type"] == "service_unavailable"
        status, lines = results["stream"]
        assert status == 200 and lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: ") :])
        assert error["error"]["code"] == 503

        start = time.monotonic()
        resp = client.post("/v1/completions", json={"prompt": "z", "max_tokens": 2})
        assert resp.status_code == 503 and time.monotonic() - start < 5
        assert "scheduler" in resp.json()["error"]["message"]
        assert httpx.get(keyed_server.url + "/health").status_code == 503
    log = keyed_server.log()
    assert "the scheduler process exited with code -9" in log
