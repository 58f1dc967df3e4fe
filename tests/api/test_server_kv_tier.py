"""A server with a file KV tier: ``meta_info``'s split of ``cached_tokens``, the OpenAI usage
(the total), ``/metrics`` against ``/get_server_info`` and the requests' own counts."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving_harness import Server, free_port, model_name, start_server, stop_server
from test_kv_tier_server import serve_and_exit
from test_server_native import metric

pytestmark = pytest.mark.timeout(180)

POOL = 160
GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-tier-server") / "tier"


@pytest.fixture(scope="module")
def tier_server(api_model_dir: Path, tier_dir: Path) -> Iterator[Server]:
    args = ["--model", str(api_model_dir), "--max-total-tokens", str(POOL)]
    srv = start_server([*args, "--kv-tier-path", str(tier_dir)], tier_dir.parent / "server.log")
    try:
        yield srv
    finally:
        assert stop_server(srv) == 0, srv.log()[-4000:]
        assert "Traceback" not in srv.log(), srv.log()[-6000:]


def _prompt(seed: int, n: int = 100) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 200) for _ in range(n)]


def test_split_usage_and_metrics(tier_server: Server) -> None:
    a, b = _prompt(1), _prompt(2)
    with tier_server.client() as c:

        def generate(ids: list[int]) -> dict:
            resp = c.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY})
            assert resp.status_code == 200, resp.text
            return resp.json()["meta_info"]

        assert generate(a)["cached_tokens_details"] == {"device": 0, "host": 0}
        generate(b)  # evicts a from the 160-token pool to the tier
        meta = generate(a)
        assert meta["cached_tokens"] == len(a) - 1
        assert meta["cached_tokens_details"] == {"device": 0, "host": len(a) - 1}
        # the OpenAI routes report the total (b is in the tier now)
        body = {"model": model_name(tier_server), "prompt": b, "max_tokens": 2, "temperature": 0}
        usage = c.post("/v1/completions", json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == len(b) - 1

        text = c.get("/metrics").text
        info = c.get("/get_server_info").json()["scheduler"]
    assert metric(text, "radixserve:cached_tokens_host_total") == 2 * (len(a) - 1)
    assert metric(text, "radixserve:cached_tokens_total") == 2 * (len(a) - 1)
    pairs = {
        "hicache_host_total_tokens": "kv_tier_capacity_tokens",
        "hicache_host_used_tokens": "kv_tier_used_tokens",
        "hicache_backup_tokens_total": "kv_tier_written_tokens",
        "load_back_tokens_total": "kv_tier_loaded_tokens",
        "swapped_out_tokens_total": "num_swapped_out_tokens",
    }
    for name, key in pairs.items():
        assert f"radixserve:{name}{{" in text, name
        assert metric(text, f"radixserve:{name}") == info[key], name
    assert info["kv_tier_loaded_tokens"] >= 2 * (len(a) - 1)
    assert info["kv_tier_capacity_tokens"] >= 2 * POOL


def test_a_second_server_on_the_directory_is_refused(
    tier_server: Server, api_model_dir: Path, tier_dir: Path
) -> None:
    """Two servers on one tier directory would serve each other's KV: the second exits with
    one line naming the directory and the process that holds it."""
    flags = ("--kv-tier-path", str(tier_dir), "--port", str(free_port()))
    proc = serve_and_exit(api_model_dir, *flags)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"--kv-tier-path {tier_dir}: another process (pid " in lines[0], lines[0]
    with tier_server.client() as c:  # the first one serves on
        assert c.get("/health").status_code == 200


def test_no_tier_metrics_without_a_tier(client: httpx.Client) -> None:
    text = client.get("/metrics").text
    assert "radixserve:cached_tokens_host_total" in text
    assert "radixserve:hicache_host_total_tokens" not in text
