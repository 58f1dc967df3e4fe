"""One server with --api-key: authentication on every route but /health. (A child's death is
tests/reliability/test_faults.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
        ("GET", "/dashboard"),
        ("GET", "/dashboard/static/dashboard.js"),
        ("GET", "/cache_tree"),
        ("GET", "/cache_tree?api_key=wrong"),
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
    # the cache page's GET routes also take the key from the URL (a browser sets no header)
    for route in ("/dashboard", "/dashboard/static/echarts.min.js", "/cache_tree"):
        assert httpx.get(f"{keyed_server.url}{route}?api_key={API_KEY}").status_code == 200
    assert httpx.get(f"{keyed_server.url}/get_load?api_key={API_KEY}").status_code == 401
    bad = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
