"""``radixserve serve --kv-tier-path``: a server stopped with SIGTERM writes its tier's index,
and the next server on the same directory serves the first request's prefix from the tier; a
page whose bytes changed in between is dropped and computed again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from serving_harness import free_port, start_server, stop_server

from radixserve.launch.cli import build_parser, make_server_config

pytestmark = pytest.mark.timeout(240)

PROMPT = [(7 * i + 3) % 900 + 5 for i in range(80)]
OTHER = [(11 * i + 5) % 900 + 5 for i in range(80)]  # another first token: a node of its own


def generate(url: str, prompt: list[int] = PROMPT) -> dict:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    r.raise_for_status()
    return r.json()


def _corrupt(tier: Path, how: str) -> None:
    """Between a clean stop and a restart: the whole ``kv.bin`` overwritten with random bytes,
    or (``zeroed``) layer 0's K of the node the index holds for ``OTHER`` zeroed."""
    storage = tier / "kv.bin"
    if how == "random":
        storage.write_bytes(os.urandom(storage.stat().st_size))
        return
    layout = json.loads((tier / "tier.json").read_text())["layout"]
    elem = torch.empty((), dtype=getattr(torch, layout["dtype"].removeprefix("torch."))).itemsize
    per_slot = layout["num_kv_heads"] * layout["head_dim"] * elem  # layer 0's K comes first
    with np.load(tier / "index.npz") as index:
        key_lens, keys, slots = index["key_lens"], index["keys"], index["slots"]
    starts = np.cumsum(key_lens) - key_lens
    entry = next(i for i, start in enumerate(starts) if keys[start] == OTHER[0])
    with open(storage, "r+b") as f:
        for slot in slots[starts[entry] : starts[entry] + key_lens[entry]]:
            f.seek(int(slot) * per_slot)
            f.write(bytes(per_slot))


def _restart(args: list[str], log: Path) -> tuple[list[dict], dict, str]:
    """A server over the same tier: both prompts' generations, its stats, its /metrics."""
    server = start_server(args, log)
    try:
        outs = [generate(server.url, p) for p in (PROMPT, OTHER)]
        stats = httpx.get(f"{server.url}/get_server_info", timeout=10).json()["scheduler"]
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert stop_server(server) == 0
    return outs, stats, metrics


@pytest.mark.slow  # two servers in turn (about 15 s); the Engine-level tier tests stay fast
def test_a_restarted_server_hits_its_file_tier_and_recomputes_a_corrupt_node(
    api_model_dir: Path, tmp_path: Path
) -> None:
    """Two prompts, two nodes in the index; between the stop and the restart one node's bytes
    are zeroed. The second server serves the intact one from the tier and computes the other
    again: both answers are the first server's."""
    args = ["--model", str(api_model_dir), "--max-total-tokens", "512"]
    args += ["--kv-tier-path", str(tmp_path / "tier"), "--kv-tier-size", "4MB"]
    before, stats, _ = _restart(args, tmp_path / "first.log")
    assert stats["kv_tier"].startswith("file:") and stats["kv_tier_capacity_tokens"] > 0
    assert before[0]["meta_info"]["cached_tokens"] == 0
    assert (tmp_path / "tier" / "index.npz").exists()
    _corrupt(tmp_path / "tier", "zeroed")
    after, stats, metrics = _restart(args, tmp_path / "second.log")
    assert [a["output_ids"] for a in after] == [b["output_ids"] for b in before]
    assert after[0]["meta_info"]["cached_tokens"] == len(PROMPT) - 1  # from the tier
    assert after[1]["meta_info"]["cached_tokens"] == 0  # its copy was dropped
    _assert_counted(stats, metrics, tmp_path / "second.log")
    assert "tokens restored" in (tmp_path / "second.log").read_text()


@pytest.mark.slow
def test_a_tier_overwritten_with_random_bytes_is_recomputed(
    api_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--model", str(api_model_dir), "--max-total-tokens", "512"]
    args += ["--kv-tier-path", str(tmp_path / "tier"), "--kv-tier-size", "4MB"]
    before, _, _ = _restart(args, tmp_path / "first.log")
    _corrupt(tmp_path / "tier", "random")
    after, stats, metrics = _restart(args, tmp_path / "second.log")
    assert [a["output_ids"] for a in after] == [b["output_ids"] for b in before]
    assert all(a["meta_info"]["cached_tokens"] == 0 for a in after)
    _assert_counted(stats, metrics, tmp_path / "second.log")


def _assert_counted(stats: dict, metrics: str, log: Path) -> None:
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
    assert (
        engine.kv_tier.kv_tier_path == str(tmp_path / "t")
        and engine.kv_tier.kv_tier_bytes == 512 << 20
    )
    assert (
        engine.kv_tier.kv_tier_write_policy == "write_through"
        and engine.admission.preemption_mode == "swap"
    )


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


def test_an_unusable_tier_path_exits_with_one_line(api_model_dir: Path, tmp_path: Path) -> None:
    """A path that cannot hold a tier (a file here; a path under /proc below) is a config
    error: one line naming the path and why, no traceback."""
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    proc = serve_and_exit(api_model_dir, "--kv-tier-path", str(path), "--port", str(free_port()))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"radixserve serve: --kv-tier-path {path}: "), lines[0]
    proc_path = "/proc/radixserve-kv-tier"
    args = build_parser().parse_args(
        ["serve", "--model", str(api_model_dir), "--kv-tier-path", proc_path]
    )
    with pytest.raises(ValueError, match=f"--kv-tier-path {proc_path}: "):
        make_server_config(args)
