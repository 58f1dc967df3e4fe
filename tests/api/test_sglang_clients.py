"""SGLang's own clients, unchanged, against a radixserve server (slow).

They run from a separate venv (SGLang's client code must not leak into ours), built once and
cached under ``~/.cache/radixserve/test-venvs`` keyed by the requirement list:

- ``sglang==0.4.9.post2`` installed ``--no-deps`` (its ``sglang.lang`` frontend imports no
  torch, unlike 0.5's), with the small packages ``sglang.lang`` imports (found by trying);
- its ``sglang/bench_serving.py``: the standalone benchmark (aiohttp, numpy, requests, tqdm,
  transformers), run as ``python -m sglang.bench_serving`` with no client flag beyond host,
  port and backend, plus its own ``--gsp-*`` sizes so the run takes seconds on a CPU (the
  defaults, 1,024 prompts of 2,048 + 128 tokens, need a 2.4k context and take far longer).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_harness import Server

# the first run builds the client venv (minutes); later runs reuse it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REQUIREMENTS = (
    ("--no-deps", "sglang==0.4.9.post2"),
    ("aiohttp", "numpy", "requests", "tqdm", "pydantic", "pybase64", "ipython", "transformers"),
)
PROGRAMS = Path(__file__).parent / "sglang_client" / "programs.py"


def _venv_python() -> Path:
    key = hashlib.sha256(json.dumps([sys.version_info[:2], REQUIREMENTS]).encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "radixserve" / "test-venvs" / f"sglang-{key[:12]}"
    python = root / "bin" / "python"
    if (root / ".complete").exists():
        return python
    venv.create(root, with_pip=True, clear=True)
    for group in REQUIREMENTS:
        cmd = [str(python), "-m", "pip", "install", "-q", *group]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(
                f"cannot install SGLang's clients ({' '.join(group)}): {done.stderr[-500:]}"
            )
    (root / ".complete").touch()
    return python


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    return _venv_python()


def _client_env(tmp_path: Path) -> dict[str, str]:
    """Offline (the tokenizer must come from the local path the server reports) and with a
    HOME of its own (bench_serving caches its prompts under ~/.cache/sglang)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _greedy(http: httpx.Client, text: str, max_new_tokens: int) -> str:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return str(http.post("/generate", json=body).json()["text"])


def _run_programs(python: Path, server: Server, tmp_path: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), str(PROGRAMS), server.url, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=_client_env(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_sglang_frontend_runs_programs_unchanged(
    sglang_python: Path, compat_server: Server, http: httpx.Client, tmp_path: Path
) -> None:
    out = _run_programs(sglang_python, compat_server, tmp_path)
    # run_batch, multi-turn: each gen is the server's greedy continuation of the text so far
    for state in out["batch"]:
        text = state["text"]
        for name in ("a1", "a2"):
            answer = state[name]
            assert answer and answer in text
            assert _greedy(http, text[: text.index(answer)], 8) == answer
    assert all(ans in ("yes", "no", "maybe") for ans in out["select"])
    fork = out["fork"]["text"]
    assert fork.startswith("Two tips.\nTip 0 was") and " and tip 1 was" in fork
    tip0 = fork[len("Two tips.\nTip 0 was") : fork.index(" and tip 1 was")]
    assert tip0 == _greedy(http, "Two tips.\nTip 0:", 6)
    stream = out["stream"]
    assert "".join(stream["pieces"]) == stream["whole"]  # (how many pieces is timing)
    assert http.get("/get_server_info").json()["integrity_ok"] is True


def test_sglang_frontend_gen_regex(
    sglang_python: Path, compat_server: Server, tmp_path: Path
) -> None:
    out = _run_programs(sglang_python, compat_server, tmp_path, "regex")
    for answer in out["regex"]:
        assert re.fullmatch(r"(yes|no), [a-z]{2,6}", answer), answer


def test_sglang_bench_serving_generated_shared_prefix(
    sglang_python: Path, compat_server: Server, http: httpx.Client, tmp_path: Path
) -> None:
    host, port = compat_server.url.removeprefix("http://").split(":")
    gsp = {"num-groups": 8, "prompts-per-group": 8, "system-prompt-len": 512}
    gsp |= {"question-len": 64, "output-len": 32}
    cmd = [str(sglang_python), "-m", "sglang.bench_serving", "--backend", "sglang"]
    cmd += ["--host", host, "--port", port, "--dataset-name", "generated-shared-prefix"]
    cmd += [arg for k, v in gsp.items() for arg in (f"--gsp-{k}", str(v))]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=_client_env(tmp_path), cwd=tmp_path
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "Successful requests:                     64" in done.stdout, done.stdout[-3000:]
    (report,) = tmp_path.glob("*.jsonl")
    result = json.loads(report.read_text().splitlines()[-1])
    assert result["completed"] == 64 and result["total_output_tokens"] == 64 * 32
    info = http.get("/get_server_info").json()
    assert info["integrity_ok"] is True and info["scheduler"]["num_cached_prompt_tokens"] > 0
