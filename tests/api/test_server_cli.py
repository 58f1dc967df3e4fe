"""``radixserve serve`` without --model: creates the embedded smoke-test model in the cache dir,
starts on it, prints a ready line and a curl example that returns a completion."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serving_harness import Server, free_port, stop_server

from radixserve.config import EngineConfig
from radixserve.launch.cli import build_parser, make_server_config
from radixserve.runtime.default_model import is_default_model_dir


def test_serve_help_lists_design_options() -> None:
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for option in (
        "--model",
        "--host",
        "--port",
        "--schedule-policy",
        "--chunked-prefill-size",
        "--max-running-requests",
        "--max-total-tokens",
        "--page-size",
        "--disable-radix-cache",
        "--disable-overlap-schedule",
        "--overlap-launch",
        "--disable-cuda-graph",
        "--cuda-graph-max-bs",
        "--enable-priority-scheduling",
        "--api-key",
        "--dtype",
        "--device",
    ):
        assert option in help_text, option


def test_overlap_launch_reaches_the_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(tmp_path / "model"))
    for argv, launch in (
        (["serve"], "thread"),
        (["serve", "--overlap-launch", "stream"], "stream"),
    ):
        config = make_server_config(build_parser().parse_args(argv))
        assert config.engine.execution.overlap_launch == launch
    with pytest.raises(ValueError, match="overlap_launch must be one of"):
        EngineConfig.from_flat(overlap_launch="process")
    with pytest.raises(SystemExit):  # argparse's choices
        build_parser().parse_args(["serve", "--overlap-launch", "graph"])


def test_bad_model_dir_exits_with_a_message(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "radixserve", "serve", "--model", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "not a model directory" in proc.stderr


def wait_for_line(log: Path, proc: subprocess.Popen[bytes], pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match.group(0)
        assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{text}"
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r} in {timeout} s:\n{log.read_text()}")


def test_no_model_option_makes_the_default_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cache" / "default-model"
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(target))
    config = make_server_config(build_parser().parse_args(["serve"]))
    assert config.is_default_model and config.model_name == "radixserve-smoke-test-random"
    assert config.engine.model_path == str(target) and is_default_model_dir(target)
    assert (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file()
    assert config.engine.max_total_tokens is not None  # a smoke test gets a small KV pool
    assert (
        not config.engine.execution.disable_cuda_graph
        and config.engine.execution.cuda_graph_max_bs is None
    )
    flags = ["serve", "--disable-cuda-graph", "--cuda-graph-max-bs", "32"]
    engine = make_server_config(build_parser().parse_args(flags)).engine
    assert engine.execution.disable_cuda_graph and engine.execution.cuda_graph_max_bs == 32


@pytest.mark.slow  # ~15-30 s on 2 cores: model creation, then three processes start
def test_serve_without_model_uses_the_embedded_default(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "default-model"
    env = {**os.environ, "HOME": str(tmp_path), "RADIXSERVE_DEFAULT_MODEL_DIR": str(cache)}
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "radixserve", "serve", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_for_line(log, proc, r"^radixserve is ready at .*$", timeout=100)
        curl = wait_for_line(log, proc, r"^  curl .*$", timeout=5).strip()
        assert is_default_model_dir(cache)
        text = log.read_text()
        assert "smoke-test model" in text and "random-weight" in text
        argv = shlex.split(curl)
        if shutil.which("curl"):
            done = subprocess.run(argv + ["-s"], capture_output=True, text=True, timeout=60)
            body = json.loads(done.stdout)
        else:
            payload = json.loads(argv[argv.index("-d") + 1])
            body = httpx.post(argv[1], json=payload, timeout=60).json()
        assert body["object"] == "text_completion"
        assert body["usage"]["completion_tokens"] > 0 and body["choices"][0]["text"]
        models = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert models[0]["is_smoke_test_model"] is True
        assert "smoke-test" in models[0]["description"]
    finally:
        assert stop_server(server) == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("broken", [False, True])
def test_default_model_is_created_once(
    tmp_path: Path, broken: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.runtime import default_model

    target = tmp_path / "m"
    calls = []

    def fake_write(out: Path, arch: str, seed: int = 0) -> Path:
        calls.append(out)
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        return Path(out)

    monkeypatch.setattr("radixserve.models.tiny.write_tiny_model", fake_write)
    if broken:  # a directory left by someone else is never overwritten
        target.mkdir()
        (target / "precious.txt").write_text("x")
        with pytest.raises(RuntimeError, match="not a radixserve default model"):
            default_model.ensure_default_model(target)
        assert (target / "precious.txt").exists()
        return
    assert default_model.ensure_default_model(target) == target
    assert default_model.ensure_default_model(target) == target
    assert len(calls) == 1 and is_default_model_dir(target)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.tmp")]


def test_serve_starts_its_scheduler_before_it_imports_torch(api_model_dir: Path) -> None:
    """``radixserve serve`` spawns the scheduler (which imports torch and loads the model) before
    this process imports torch or transformers, so that the two load side by side; the
    detokenizer is spawned with a decoder that needs neither."""
    code = f"""
import sys
import radixserve.launch.server as server

def spawned(name, target, args, *rest):
    print(name, sorted({{"torch", "transformers"}} & set(sys.modules)), type(args[1]).__name__)
    if name == "detokenizer":
        raise SystemExit(0)

server._start_child = spawned
from radixserve.cli import main
main(["serve", "--model", {str(api_model_dir)!r}])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == [
        "scheduler [] IpcEndpoints",
        "detokenizer ['torch', 'transformers'] str",
    ], out.stdout + out.stderr


def test_data_parallel_peers_started_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--dp-peers`` and ``--dp-rank`` for workers started by hand behind one gateway: each
    knows where the others' stored objects are (``api/responses/peers.py``)."""
    monkeypatch.setenv("RADIXSERVE_DEFAULT_MODEL_DIR", str(tmp_path / "model"))
    peers = ["http://10.0.0.11:30001", "http://10.0.0.12:30001"]
    argv = ["serve", "--dp-rank", "1", "--dp-peers", *peers]
    config = make_server_config(build_parser().parse_args(argv))
    assert config.state_peers == tuple(peers) and config.engine.parallel.dp_rank == 1
    assert make_server_config(build_parser().parse_args(["serve"])).state_peers == ()
    for bad, why in (
        (["--dp-rank", "2", "--dp-peers", *peers], "not a place among 2"),
        (["--dp-peers", "10.0.0.11:30001"], "http:// or https://"),
    ):
        with pytest.raises(ValueError, match=why):
            make_server_config(build_parser().parse_args(["serve", *bad]))
