"""``--model ORG/NAME``: a hub id resolved through huggingface_hub's cache, offline, from a
cache directory laid out here as huggingface_hub lays it out (``HF_HOME``,
``HF_HUB_OFFLINE=1``, ``--revision`` by branch or commit); a local directory still works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serving_harness import start_server, stop_server

MAIN, V1 = "a" * 40, "b" * 40  # the commits that refs/main and refs/v1 point at


@pytest.fixture(scope="module")
def hf_home(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / "models--acme--tiny-llama"
    for ref, commit in (("main", MAIN), ("v1", V1)):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        shutil.copytree(api_model_dir, repo / "snapshots" / commit)
    (repo / "snapshots" / V1 / "marker.txt").write_text("v1")
    return home


def _env(hf_home: Path) -> dict[str, str]:
    return {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def _resolve(
    hf_home: Path, model: str, revision: str | None = None
) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from radixserve.hub import resolve_model\n"
        "try:\n    print(resolve_model(sys.argv[1], sys.argv[2] or None))\n"
        "except ValueError as exc:\n    print('ValueError:', exc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, model, revision or ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(hf_home),
        check=True,
    )


def test_a_hub_id_resolves_to_its_cached_snapshot(hf_home: Path, api_model_dir: Path) -> None:
    snapshots = hf_home / "hub" / "models--acme--tiny-llama" / "snapshots"
    assert _resolve(hf_home, "acme/tiny-llama").stdout.strip() == str(snapshots / MAIN)
    assert _resolve(hf_home, "acme/tiny-llama", "v1").stdout.strip() == str(snapshots / V1)
    assert _resolve(hf_home, "acme/tiny-llama", V1).stdout.strip() == str(snapshots / V1)
    assert _resolve(hf_home, str(api_model_dir)).stdout.strip() == str(api_model_dir.resolve())
    missing = _resolve(hf_home, "acme/not-cached").stdout
    assert missing.startswith("ValueError: acme/not-cached is not in the hub cache"), missing
    assert "not a model directory" in _resolve(hf_home, "/no/such/dir").stdout


@pytest.mark.slow  # a whole server from a hub cache (about 7 s); the resolution is tested above
def test_serve_a_hub_id_offline(hf_home: Path, tmp_path: Path) -> None:
    server = start_server(
        ["--model", "acme/tiny-llama", "--revision", "v1", "--max-total-tokens", "4096"],
        tmp_path / "server.log",
        env=_env(hf_home),
    )
    try:
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["acme/tiny-llama"]  # the name asked for
        out = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "acme/tiny-llama", "prompt": "def f(x):", "max_tokens": 4},
            timeout=60,
        )
        assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 4
    finally:
        assert stop_server(server) == 0, server.log()[-3000:]


def test_serving_an_uncached_hub_id_offline_says_why(hf_home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "radixserve", "serve", "--model", "acme/absent"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(hf_home),
    )
    assert proc.returncode == 2 and "not in the hub cache" in proc.stderr, proc.stderr
