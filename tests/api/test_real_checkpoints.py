"""The server on a random model that carries a real checkpoint's tokenizer and template
(Qwen3-0.6B's shape shrunk, the real 151,936-row vocabulary): the requests that killed it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_harness import Server, start_server, stop_server

pytest.importorskip("llguidance")

THINK = "<think>\n[a-z]{4}\n</think>\n\n[a-z ]{1,12}"
TOOL_CALL = '<tool_call>\n\\{"name": "[a-z_]{1,8}", "arguments": \\{\\}\\}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3_server(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("qwen3-log") / "server.log"
    args = ["--model", str(qwen3_model_dir), "--served-model-name", "qwen3"]
    srv = start_server([*args, "--max-total-tokens", "8192"], log)
    try:
        yield srv
    finally:
        code = stop_server(srv)
        assert code == 0, f"the server did not stop cleanly ({code}):\n{srv.log()[-4000:]}"
        assert "Traceback" not in srv.log(), srv.log()[-6000:]


@pytest.mark.parametrize("pattern", [THINK, TOOL_CALL], ids=["think", "tool_call"])
def test_a_regex_over_qwen3_added_tokens_is_served(qwen3_server: Server, pattern: str) -> None:
    with qwen3_server.client() as http:
        for temperature in (0.0, 1.0):
            resp = http.post(
                "/v1/chat/completions",
                json={
                    "model": "qwen3",
                    "messages": [{"role": "user", "content": "Think, then answer."}],
                    "regex": pattern,
                    "max_tokens": 64,
                    "temperature": temperature,
                },
            )
            assert resp.status_code == 200, resp.text
            choice = resp.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            assert re.fullmatch(pattern, choice["message"]["content"]), choice
        assert http.get("/health").status_code == 200
        info = http.get("/get_server_info").json()
        assert info["scheduler"]["num_failed_reqs"] == 0, info["scheduler"]
