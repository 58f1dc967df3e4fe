"""Hostile or malformed input gets a clear 4xx in OpenAI's error shape, cheaply and before the body
is read or tokenized where it can be, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
from reliability_harness import API_KEY, MAX_REQUEST_BYTES, MAX_STOP_STRINGS, server_args
from serving_harness import Server, start_server, stop_server

pytestmark = pytest.mark.timeout(300)  # each may start a server on a loaded machine

MSGS = '"messages": [{"role": "user", "content": "hi"}]'


def assert_error(resp: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert body["error"]["param"] == param, body
    return dict(body["error"])


def raw_post(server: Server, route: str, payload: bytes, **headers: str) -> httpx.Response:
    with server.client(timeout=30) as c:
        return c.post(route, content=payload, headers=headers)


@pytest.mark.parametrize(
    "route,payload",
    [
        ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 1}'),
        ("/generate", b'{"text": "\\udc00"}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udbff"}]}'),
        ("/v1/completions", b'{"prompt": "x", "stop": ["\\ud800"]}'),
        ("/v1/completions", b'{"model": "\\ud800", "prompt": "x"}'),
    ],
)
def test_lone_surrogates_are_400(guarded: Server, route: str, payload: bytes) -> None:
    err = assert_error(raw_post(guarded, route, payload), 400)
    assert "surrogate" in err["message"]


def test_a_surrogate_pair_is_fine(guarded: Server) -> None:
    payload = b'{"prompt": "smile \\ud83d\\ude00", "max_tokens": 1}'  # U+1F600, escaped
    assert raw_post(guarded, "/v1/completions", payload).status_code == 200


NAN_BODIES = [
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "temperature": NaN}', "temperature"),
    ("/v1/completions", '{"prompt": "x", "stream": true, "top_p": Infinity}', "top_p"),
    ("/v1/chat/completions", "{" + MSGS + ', "temperature": NaN}', None),
    (
        "/v1/chat/completions",
        "{" + MSGS + ', "stream": true, "min_p": -Infinity}',
        None,
    ),
    ("/generate", '{"text": "x", "sampling_params": {"temperature": NaN}}', None),
    (
        "/generate",
        '{"text": "x", "stream": true, "sampling_params": {"repetition_penalty": NaN}}',
        None,
    ),
]


@pytest.mark.parametrize("route,payload,param", NAN_BODIES)
def test_nan_and_inf_are_400(guarded: Server, route: str, payload: str, param: str | None) -> None:
    err = assert_error(raw_post(guarded, route, payload.encode()), 400, param)
    assert "finite" in err["message"]


COERCED_BODIES = [  # values pydantic's lax mode would convert: each is a 400 (naming the field)
    ("/generate", '{"input_ids": [true, 5]}', "input_ids"),
    ("/generate", '{"input_ids": ["5"]}', "input_ids"),
    ("/generate", '{"text": "x", "stream": "yes"}', "stream"),
    ("/generate", '{"text": "x", "sampling_params": {"max_new_tokens": "4"}}', None),
    ("/generate", '{"text": "x", "sampling_params": {"ignore_eos": 1}}', None),
    ("/v1/completions", '{"prompt": "x", "stream": "yes"}', "stream"),
    ("/v1/completions", '{"prompt": [true, 5]}', "prompt"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": "4"}', "max_tokens"),
    ("/v1/chat/completions", "{" + MSGS + ', "stream": "true"}', "stream"),
    ("/v1/chat/completions", "{" + MSGS + ', "logprobs": "yes"}', "logprobs"),
]


@pytest.mark.parametrize("route,payload,param", COERCED_BODIES)
def test_values_of_the_wrong_type_are_400(
    guarded: Server, route: str, payload: str, param: str | None
) -> None:
    err = assert_error(raw_post(guarded, route, payload.encode()), 400)
    assert param is None or err["param"].startswith(param), err  # e.g. input_ids.0


def test_numbers_and_token_id_keys_still_validate(guarded: Server) -> None:
    """Strict types keep what JSON cannot say otherwise: an integer where a float goes, a token
    id as an object key (a string)."""
    payload = b'{"prompt": "x", "max_tokens": 2, "temperature": 0, "logit_bias": {"5": 1}}'
    resp = raw_post(guarded, "/v1/completions", payload)
    assert resp.status_code in (200, 400), resp.text  # logit_bias may be refused, never coerced
    if resp.status_code == 400:
        assert resp.json()["error"]["param"] == "logit_bias"
    body = b'{"text": "x", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}'
    assert raw_post(guarded, "/generate", body).status_code == 200


def test_a_tiny_temperature_is_greedy(guarded: Server) -> None:
    body = {"prompt": "def f(x):", "max_tokens": 8, "ignore_eos": True}
    with guarded.client() as c:
        greedy = c.post("/v1/completions", json={**body, "temperature": 0}).json()
        tiny = c.post("/v1/completions", json={**body, "temperature": 1e-45}).json()
    assert tiny["choices"][0]["text"] == greedy["choices"][0]["text"]


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/v1/models"])
def test_docs_need_the_key(guarded: Server, path: str) -> None:
    resp = httpx.get(guarded.url + path)
    assert_error(resp, 401)
    assert httpx.get(guarded.url + path, headers=guarded.headers).status_code == 200


def test_the_key_is_checked_before_the_body_is_read(guarded: Server) -> None:
    """A client that announces 512 MB and sends a few bytes is refused at once: the server
    never waits for (or reads) the body of an unauthenticated request."""
    status, elapsed = _announce_big_body(guarded, "Bearer wrong")
    assert status == 401 and elapsed < 5


def _announce_big_body(server: Server, authorization: str) -> tuple[int, float]:
    """Send the headers of a 512 MB POST and 12 bytes of body; the status line's code, and how
    long it took to come."""
    host, port = server.url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = (
            "POST /v1/completions HTTP/1.1\r\n"
            f"Host: {host}\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {512 << 20}\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"prompt": "')
        status_line = sock.makefile("rb").readline()
    return int(status_line.split()[1]), time.monotonic() - start


def test_too_large_bodies_are_413(guarded: Server) -> None:
    big = json.dumps({"prompt": "a" * (MAX_REQUEST_BYTES + 10)}).encode()
    err = assert_error(raw_post(guarded, "/v1/completions", big), 413)
    assert "--max-request-bytes" in err["message"]

    def chunks() -> Any:  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(MAX_REQUEST_BYTES // 65536 + 2):
            yield b"a" * 65536
        yield b'"}'

    with guarded.client(timeout=30) as c:
        assert_error(c.post("/v1/completions", content=chunks()), 413)
    # a declared size over the limit is refused before a byte of it is read
    status, elapsed = _announce_big_body(guarded, f"Bearer {API_KEY}")
    assert status == 413 and elapsed < 5


def test_an_overlong_prompt_is_refused_before_tokenizing(guarded: Server) -> None:
    """Just under the body limit, far over the context: refused by its length in characters
    (tokenizing it would take seconds on this machine)."""
    prompt = "hello world " * ((MAX_REQUEST_BYTES - 1000) // 12)
    start = time.monotonic()
    with guarded.client(timeout=30) as c:
        err = assert_error(c.post("/v1/completions", json={"prompt": prompt}), 400, "prompt")
        assert_error(c.post("/generate", json={"text": prompt}), 400)
    assert "maximum context length" in err["message"]
    assert time.monotonic() - start < 2.0


def test_many_stop_strings_are_400(guarded: Server) -> None:
    stops = [f"s{i:07d}x" for i in range(MAX_STOP_STRINGS + 1)]
    with guarded.client() as c:
        err = assert_error(c.post("/v1/completions", json={"prompt": "x", "stop": stops}), 400)
        assert err["param"] == "stop" and "--max-stop-strings" in err["message"]
        native = {"text": "x", "sampling_params": {"stop": stops}}
        assert_error(c.post("/generate", json=native), 400, "stop")
        ok = {"prompt": "x", "max_tokens": 2, "stop": stops[:MAX_STOP_STRINGS]}
        assert c.post("/v1/completions", json=ok).status_code == 200


@pytest.mark.parametrize("payload", [b"", b"   "])
def test_an_empty_body_names_the_problem(guarded: Server, payload: bytes) -> None:
    err = assert_error(raw_post(guarded, "/v1/completions", payload), 400)
    assert "None" not in err["message"], err


def test_the_spec_declares_the_real_errors(guarded: Server) -> None:
    spec = httpx.get(guarded.url + "/openapi.json", headers=guarded.headers).json()
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ErrorResponse" in schemas
    for path, item in spec["paths"].items():
        for method, op in item.items():
            assert "422" not in op["responses"], (path, method)
            if path != "/health":
                assert {"400", "401", "503"} <= set(op["responses"]), (path, method)
    ok = spec["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/CompletionResponse"}
    assert "text/event-stream" in ok
    # and the server sends what it declares: a 400 in the ErrorResponse shape
    with guarded.client() as c:
        assert_error(c.post("/v1/completions", json={"prompt": "x", "max_tokens": "many"}), 400)


@pytest.mark.slow  # a server of its own for one flag (about 7 s)
def test_disable_docs(rel_model_dir: Any, tmp_path: Any) -> None:
    srv = start_server(server_args(rel_model_dir, "--disable-docs"), tmp_path / "log")
    try:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert httpx.get(srv.url + path).status_code == 404
        assert httpx.get(srv.url + "/v1/models").status_code == 200  # no key: open
    finally:
        assert stop_server(srv) == 0


def test_key_header_variants(guarded: Server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        assert_error(httpx.get(guarded.url + "/get_model_info", headers=headers), 401)
