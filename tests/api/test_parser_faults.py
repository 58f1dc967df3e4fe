"""A parser that raises ends its request, not the server: the reasoning parser is made to fail
on one output (a ``sitecustomize`` on the server's ``PYTHONPATH`` patches it in every process
of the real server); that request gets OpenAI's error shape (a 500, or an error event and
``[DONE]`` in a stream), the others are served, and the server stops cleanly."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_harness import Server, start_server, stop_server

pytest.importorskip("llguidance")

PATCH = """
import os
if os.environ.get("RADIXSERVE_TEST_PARSER_FAULT"):
    from radixserve.api.formats import reasoning

    _feed = reasoning.ReasoningParser._feed

    def _failing_feed(self, text):
        if "FAULT" in text:
            raise RuntimeError("injected: the reasoning parser failed")
        return _feed(self, text)

    reasoning.ReasoningParser._feed = _failing_feed
"""


@pytest.fixture(scope="module")
def faulty_server(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(PATCH)
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "RADIXSERVE_TEST_PARSER_FAULT": "1"}
    args = ["--model", str(qwen3_model_dir), "--served-model-name", "qwen3"]
    args += ["--reasoning-parser", "qwen3", "--max-total-tokens", "8192"]
    server = start_server(args, tmp_path_factory.mktemp("faulty-log") / "server.log", env=env)
    try:
        yield server
    finally:
        assert stop_server(server) == 0, server.log()[-4000:]


def _body(thinking: str, stream: bool = False) -> dict:
    return {
        "model": "qwen3",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": stream,
        "regex": f"<think>{thinking}</think>ok",
    }


@pytest.mark.slow  # a server of its own (patched in every process) for one check
def test_a_failing_parser_fails_its_request_only(faulty_server: Server) -> None:
    with faulty_server.client() as http:
        failed = http.post("/v1/chat/completions", json=_body("FAULT"))
        assert failed.status_code == 500, failed.text
        error = failed.json()["error"]
        assert "injected" in error["message"] and error["type"] == "server_error"
        with http.stream("POST", "/v1/chat/completions", json=_body("FAULT", True)) as resp:
            lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert "injected" in events[-1]["error"]["message"], events[-1]
        fine = http.post("/v1/chat/completions", json=_body("fine"))
        assert fine.status_code == 200, fine.text
        message = fine.json()["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("fine", "ok")
        assert http.get("/health").status_code == 200
        info = http.get("/get_server_info").json()  # checks the KV accounting once idle
        assert info["integrity_ok"] is True, info
