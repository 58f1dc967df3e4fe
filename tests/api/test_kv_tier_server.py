"""``radixserve serve --kv-tier-path``: a server stopped with SIGTERM writes its tier's index,
and the next server on the same directory serves the first request's prefix from the tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from serving_harness import start_server, stop_server

from radixserve.api.cli import build_parser, make_server_config

PROMPT = [(7 * i + 3) % 900 + 5 for i in range(80)]


def generate(url: str) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    r.raise_for_status()
    return r.json()


def _corrupt(tier: Path, how: str) -> None:
    """Between a clean stop and a restart: the whole ``kv.bin`` overwritten with random bytes,
    or 64 KiB zeroed where layer 0's V of the first tokens lives (what the index names)."""
    storage = tier / "kv.bin"
    if how == "random":
        storage.write_bytes(os.urandom(storage.stat().st_size))
        return
    header = json.loads((tier / "tier.json").read_text())
    layout = header["layout"]
    elem = torch.empty((), dtype=getattr(torch, layout["dtype"].removeprefix("torch."))).itemsize
    offset = header["num_slots"] * layout["num_kv_heads"] * layout["head_dim"] * elem
    with open(storage, "r+b") as f:
        f.seek(offset)
        f.write(bytes(64 << 10))


def _restart(args: list[str], log: Path) -> tuple[dict, dict, str]:
    """A server over the same tier: the generation, its scheduler stats, its /metrics."""
    server = start_server(args, log)
    try:
        out = generate(server.url)
        stats = httpx.get(f"{server.url}/get_server_info", timeout=10).json()["scheduler"]
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert stop_server(server) == 0
    return out, stats, metrics


def test_a_restarted_server_hits_its_file_tier_and_recomputes_a_corrupt_one(
    api_model_dir: Path, tmp_path: Path
) -> None:
    """The second server serves the first request's prefix from the tier; then 64 KiB of
    ``kv.bin`` zeroed where the index's pages live (issue #28, item 2): the third server's
    pages fail their checksums, are dropped and computed again, and the answer is the same."""
    args = ["--model", str(api_model_dir), "--max-total-tokens", "512"]
    args += ["--kv-tier-path", str(tmp_path / "tier"), "--kv-tier-size", "4MB"]
    before, stats, _ = _restart(args, tmp_path / "first.log")
    assert stats["kv_tier"].startswith("file:") and stats["kv_tier_capacity_tokens"] > 0
    assert before["meta_info"]["cached_tokens"] == 0
    assert (tmp_path / "tier" / "index.npz").exists()
    after, _, _ = _restart(args, tmp_path / "second.log")
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["cached_tokens"] == len(PROMPT) - 1
    assert "tokens restored" in (tmp_path / "second.log").read_text()
    _corrupt(tmp_path / "tier", "zeroed")
    _assert_recomputed(args, tmp_path / "third.log", before)


@pytest.mark.slow
def test_a_tier_overwritten_with_random_bytes_is_recomputed(
    api_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--model", str(api_model_dir), "--max-total-tokens", "512"]
    args += ["--kv-tier-path", str(tmp_path / "tier"), "--kv-tier-size", "4MB"]
    before, _, _ = _restart(args, tmp_path / "first.log")
    _corrupt(tmp_path / "tier", "random")
    _assert_recomputed(args, tmp_path / "second.log", before)


def _assert_recomputed(args: list[str], log: Path, before: dict) -> None:
    after, stats, metrics = _restart(args, log)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["cached_tokens"] == 0  # nothing of the prompt came from the tier
    assert stats["kv_tier_corrupt_pages"] > 0
    assert "radixserve:kv_tier_corrupt_pages_total" in metrics
    assert "failed their checksum" in log.read_text()


def test_tier_flags_reach_the_engine_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["serve", "--model", str(tmp_path), "--kv-tier-path", str(tmp_path / "t")]
        + ["--kv-tier-size", "512MiB", "--hicache-write-policy", "write_through"]
        + ["--preemption-mode", "swap"]
    )
    (tmp_path / "config.json").write_text("{}")
    engine = make_server_config(args).engine
    assert engine.kv_tier_path == str(tmp_path / "t") and engine.kv_tier_bytes == 512 << 20
    assert engine.kv_tier_write_policy == "write_through" and engine.preemption_mode == "swap"


def serve_and_exit(model_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``radixserve serve`` with ``flags`` that must make it exit before serving."""
    cmd = [sys.executable, "-m", "radixserve", "serve", "--model", str(model_dir), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_swap_without_a_tier_exits_with_a_message(api_model_dir: Path) -> None:
    proc = serve_and_exit(api_model_dir, "--preemption-mode", "swap")
    assert proc.returncode != 0
    assert "needs a KV tier" in proc.stderr


def test_a_bad_tier_size_is_refused_by_the_parser(api_model_dir: Path) -> None:
    proc = serve_and_exit(api_model_dir, "--kv-tier-size", "lots")
    assert proc.returncode == 2 and "not a size" in proc.stderr
