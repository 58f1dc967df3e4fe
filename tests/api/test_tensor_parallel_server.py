"""``radixserve serve --tp-size 2``: the greedy tokens of the in-process tp=1 Engine through HTTP
(radix cache on, chunked prefill, a retraction-forcing pool); SIGTERM stops every rank; a rank
killed outright ends the server with exit code 1 and says which rank, instead of hanging."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_harness import start_server, stop_server

from radixserve import Engine

SERVER_ARGS = [
    "--tp-size", "2", "--dtype", "float32", "--chunked-prefill-size", "16",
    "--max-total-tokens", "384", "--max-running-requests", "8",
]  # fmt: skip
PARAMS = {"max_new_tokens": 60, "temperature": 0.0}


def _prompts(tokenizer: Any) -> list[list[int]]:
    stems = ["def fibonacci(n):\n    if n < 2:", "import os\nimport sys\nclass Foo(object):"]
    texts = [stems[i % 2] + f"\n    x_{i} = [{i}, {i + 1}] * {i + 2}\n" for i in range(8)]
    return [tokenizer.encode(t * 2)[:24] for t in texts]


def _rank_pid(log: str) -> int:
    match = re.search(r"tensor parallel: 2 ranks joined \(pids \[(\d+)\]\)", log)
    assert match, log[-3000:]
    return int(match.group(1))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp2_server_gives_the_tokens_of_tp1_and_stops_cleanly(
    tiny_model_dirs: dict[str, Path], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    model = tiny_model_dirs["qwen3"]
    prompts = _prompts(tiny_tokenizer)
    with Engine(
        str(model), tokenizer=tiny_tokenizer, dtype="float32", chunked_prefill_size=16,
        max_total_tokens=384, max_running_requests=8,
    ) as engine:  # fmt: skip
        want = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=PARAMS)]
        assert engine.get_stats()["num_retractions"] > 0
    server = start_server(["--model", str(model), *SERVER_ARGS], tmp_path / "server.log")
    try:
        pid = _rank_pid(server.log())
        with server.client(timeout=120) as client:
            response = client.post(
                "/generate", json={"input_ids": prompts, "sampling_params": PARAMS}
            )
            assert response.status_code == 200, response.text
            assert [r["output_ids"] for r in response.json()] == want
            # the prompts again: served from the radix cache, the same tokens
            again = client.post("/generate", json={"input_ids": prompts, "sampling_params": PARAMS})
            assert [r["output_ids"] for r in again.json()] == want
            assert all(r["meta_info"]["cached_tokens"] > 0 for r in again.json())
            info = client.get("/get_server_info").json()
            assert info["scheduler"]["num_retractions"] > 0
    finally:
        code = stop_server(server)
    assert code == 0, server.log()[-4000:]
    assert _gone(pid), "the tensor-parallel rank outlived the server"
    assert "Traceback" not in server.log(), server.log()[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_killed_rank_ends_the_server_with_a_clear_error(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    server = start_server(
        ["--model", str(tiny_model_dirs["qwen2"]), *SERVER_ARGS], tmp_path / "s.log"
    )
    try:
        pid = _rank_pid(server.log())
        body = {"text": "def f(x):", "sampling_params": {"max_new_tokens": 4}}
        assert httpx.post(f"{server.url}/generate", json=body, timeout=60).status_code == 200
        os.kill(pid, signal.SIGKILL)  # while the server idles
        server.proc.wait(30)
        assert server.proc.returncode == 1
        assert "tensor-parallel rank 1" in server.log(), server.log()[-4000:]
    finally:
        stop_server(server)
