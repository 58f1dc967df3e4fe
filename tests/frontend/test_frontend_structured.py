"""``gen(regex=, json_schema=)``, ``gen_int`` and ``gen_string`` through both backends: the
in-process ``Runtime``, and ``RuntimeEndpoint`` against an HTTP server whose ``/generate``
hands the posted body (SGLang's ``sampling_params`` keys) to a real Engine."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from radixserve.frontend import (
    ChatTemplate,
    RuntimeEndpoint,
    function,
    gen,
    gen_int,
    gen_string,
)
from radixserve.frontend.ir import REGEX_INT, REGEX_STR

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "rank": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": ["city", "rank"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def generate_server(fe_runtime: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A ``/generate`` over the Runtime's engine, recording every posted body."""
    bodies: list[dict[str, Any]] = []
    engine = fe_runtime.engine

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {"model_path": "tiny"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            try:
                self._send(200, engine.generate(body["text"], body["sampling_params"]))
            except ValueError as exc:
                self._send(400, {"error": {"message": str(exc)}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    server.shutdown()


@function
def profile(s: Any) -> None:
    s += "Age: " + gen_int("age", max_tokens=8) + "\n"
    s += "Name: " + gen_string("name", max_tokens=16) + "\n"
    s += "Code: " + gen("code", regex=r"[A-Z]{2}-[0-9]{3}") + "\n"
    s += "JSON: " + gen("obj", json_schema=SCHEMA, max_tokens=64, temperature=0)


def _check(state: Any) -> None:
    # max_tokens may cut a gen_int / gen_string: its text is then a prefix of a match
    assert re.fullmatch(r"[-+]?[0-9]*", state["age"]) and state["age"]
    assert re.fullmatch(r'"[^"\\\n]*"?', state["name"])
    assert state["code"] and re.fullmatch(r"[A-Z]{2}-[0-9]{3}", state["code"])
    obj = json.loads(state["obj"])
    assert set(obj) == {"city", "rank"} and isinstance(obj["rank"], int)


def test_constrained_gen_through_the_runtime(fe_runtime: Any) -> None:
    state = profile.run(backend=fe_runtime)
    _check(state)
    for name, pattern in (("age", REGEX_INT), ("name", REGEX_STR)):
        # within max_tokens the text is a prefix of a match, and a whole one when it stopped
        meta = state.get_meta_info(name)
        if meta["finish_reason"]["type"] == "stop":
            assert re.fullmatch(pattern, state[name]), (name, state[name])
    fe_runtime.engine.check_integrity()


def test_constrained_gen_through_the_endpoint(generate_server: Any, fe_runtime: Any) -> None:
    url, bodies = generate_server
    endpoint = RuntimeEndpoint(url, load_tokenizer=False, chat_template=ChatTemplate.chatml())
    state = profile.run(backend=endpoint)
    _check(state)
    sent = [b["sampling_params"] for b in bodies]
    assert {"regex": REGEX_INT} == {k: v for k, v in sent[0].items() if k == "regex"}
    assert sent[-1]["json_schema"] == json.dumps(SCHEMA)  # SGLang sends a JSON string
    assert "regex" not in sent[-1]


def test_regex_and_json_schema_together_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="at most one"):
        gen("x", regex="a", json_schema="{}")
