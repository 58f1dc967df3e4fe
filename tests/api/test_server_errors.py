"""Bad input: each gets a 4xx in OpenAI's error shape, and the server keeps serving."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from serving_harness import MAX_CONTEXT_LEN

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

# (route, JSON body or raw bytes, expected status, expected param or None for any)
BAD_REQUESTS: dict[str, tuple[str, Any, int, str | None]] = {
    "malformed json": (COMPLETIONS, b'{"prompt": "x", "max_tokens": ', 400, None),
    "not an object": (COMPLETIONS, b"[1, 2, 3]", 400, None),
    "non-utf8 bytes": (COMPLETIONS, b'{"prompt": "\xff\xfe\xfa"}', 400, None),
    "missing prompt": (COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    "missing messages": (CHAT, {"max_tokens": 3}, 400, "messages"),
    "wrong type": (COMPLETIONS, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    "negative max_tokens": (COMPLETIONS, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    "huge max_tokens": (COMPLETIONS, {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    "huge max_completion_tokens": (
        CHAT,
        {"messages": USER, "max_completion_tokens": MAX_CONTEXT_LEN},
        400,
        "max_completion_tokens",
    ),
    "negative temperature": (CHAT, {"messages": USER, "temperature": -0.5}, 400, "temperature"),
    "top_p zero": (COMPLETIONS, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    "top_p above one": (CHAT, {"messages": USER, "top_p": 1.5}, 400, "top_p"),
    "prompt longer than context": (
        COMPLETIONS,
        {"prompt": list(range(10, 10 + MAX_CONTEXT_LEN + 5)), "max_tokens": 1},
        400,
        "prompt",
    ),
    "1 MB of text": (CHAT, {"messages": [{"role": "user", "content": "a b " * 262144}]}, 400, None),
    "unknown model": (CHAT, {"model": "gpt-17", "messages": USER}, 404, "model"),
    "empty messages": (CHAT, {"messages": []}, 400, "messages"),
    "invalid role": (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    "token id out of vocab": (COMPLETIONS, {"prompt": [1, 10**7]}, 400, None),
    "empty prompt": (COMPLETIONS, {"prompt": ""}, 400, None),
    "n zero": (COMPLETIONS, {"prompt": "x", "n": 0}, 400, "n"),
    "native unknown sampling param": (
        "/generate",
        {"text": "x", "sampling_params": {"max_new_tokens": 2, "tempreature": 0.5}},
        400,
        None,
    ),
    "native text and input_ids": ("/generate", {"text": "x", "input_ids": [1]}, 400, None),
    "native negative top_k": (
        "/generate",
        {"text": "x", "sampling_params": {"top_k": -5}},
        400,
        None,
    ),
    "native batch length mismatch": (
        "/generate",
        {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}]},
        400,
        None,
    ),
    "native stream of a bad request": (
        "/generate",
        {"text": "x", "stream": True, "sampling_params": {"temperature": -1}},
        400,
        None,
    ),
    "unknown route": ("/v2/nothing", {"x": 1}, 404, None),
}


def assert_error_shape(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    return dict(err)


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_openai_error(client: httpx.Client, case: str) -> None:
    route, body, status, param = BAD_REQUESTS[case]
    if isinstance(body, bytes):
        resp = client.post(route, content=body, headers={"Content-Type": "application/json"})
    else:
        resp = client.post(route, json=body)
    err = assert_error_shape(resp, status)
    if param is not None:
        assert err["param"] == param, err
    if status == 404 and route == CHAT:
        assert err["code"] == "model_not_found"
    # still serving
    ok = client.post(COMPLETIONS, json={"prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_openai_client_raises_typed_errors(openai_client: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError):
        openai_client.completions.create(model="tiny-llama", prompt="x", max_tokens=-3)
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.create(model="nope", messages=USER)
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model="tiny-llama", messages=USER, temperature=-1)


# a JSON schema nested 3,000 objects deep, as JSON text (json.dumps of it as an object recurses)
DEEP_SCHEMA = '{"type": "object", "properties": {"a": ' * 3000 + "{}" + "}}" * 3000
DEEP_BODIES = {
    "native json_schema string": (
        "/generate",
        json.dumps({"text": "x", "sampling_params": {"json_schema": DEEP_SCHEMA}}),
        "json_schema nests objects and arrays deeper than the limit",
    ),
    "native json_schema object": (
        "/generate",
        '{"text": "x", "sampling_params": {"json_schema": ' + DEEP_SCHEMA + "}}",
        "nests JSON deeper than",
    ),
    "chat response_format": (
        CHAT,
        '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": '
        '"json_schema", "json_schema": {"name": "deep", "schema": ' + DEEP_SCHEMA + "}}}",
        "nests JSON deeper than",
    ),
    "deep body with a lone surrogate": (
        COMPLETIONS,
        '{"prompt": "\\ud800", "x": ' + "[" * 3000 + "]" * 3000 + "}",
        "nests JSON deeper than",
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(DEEP_BODIES))
def test_a_schema_nested_3000_deep_is_a_400_that_says_so(client: httpx.Client, case: str) -> None:
    """However the deep schema arrives (a JSON string, an object in the body, the OpenAI
    ``response_format``), the answer is a 400 naming the nesting, never a 500."""
    route, body, fragment = DEEP_BODIES[case]
    resp = client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert fragment in assert_error_shape(resp, 400)["message"]
    ok = client.post(COMPLETIONS, json={"prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_server_is_clean_after_bad_input(client: httpx.Client) -> None:
    info = client.get("/get_server_info").json()
    assert info["integrity_ok"] is True
    assert info["scheduler"]["num_running_reqs"] == 0
    assert info["scheduler"]["num_waiting_reqs"] == 0
