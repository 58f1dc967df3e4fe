"""Fan-out and the disconnect storm: a request that fans out into many scheduler requests is capped
and never stalls the HTTP process; clients that vanish at random points leave no request running and
no KV slot held."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from reliability_harness import MAX_SUB_REQUESTS
from serving_harness import Server

pytestmark = pytest.mark.timeout(300)  # each may start a server on a loaded machine

STORM_CLIENTS = 200


def test_fan_out_past_the_cap_is_400(guarded: Server) -> None:
    body = {"prompt": [[7, 8]] * 300, "n": 128, "max_tokens": 1}
    start = time.monotonic()
    with guarded.client() as c:
        resp = c.post("/v1/completions", json=body)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert "--max-batch-sub-requests" in err["message"] and err["param"] == "prompt"
        native = {"input_ids": [[7, 8]] * (MAX_SUB_REQUESTS + 1)}
        assert c.post("/generate", json=native).status_code == 400
    assert time.monotonic() - start < 5


def test_a_full_fan_out_keeps_health_fast(guarded: Server) -> None:
    """prompts x n at the cap: one waiter for the whole group, so /health stays fast."""
    body = {"prompt": [[7, 8, 9]] * (MAX_SUB_REQUESTS // 8), "n": 8, "max_tokens": 2}
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=guarded.url, timeout=30) as c:
            while not done.is_set() and len(latencies) < 2000:
                start = time.monotonic()
                assert c.get("/health").status_code == 200
                latencies.append(time.monotonic() - start)
                time.sleep(0.02)

    # the probe's own failure (a /health that is not 200) surfaces through .result()
    with ThreadPoolExecutor(1) as pool:
        probing = pool.submit(probe)
        try:
            with guarded.client(timeout=120) as c:
                resp = c.post("/v1/completions", json=body)
        finally:
            done.set()
        probing.result(timeout=60)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == MAX_SUB_REQUESTS
    assert latencies and max(latencies) < 1.0, sorted(latencies)[-5:]


async def _storm_client(url: str, headers: dict[str, str], rng: random.Random, i: int) -> str:
    """One client that leaves at a random point: before the response, after k events, or
    never (reads to the end)."""
    cut = rng.choice(["connect", "events", "events", "events", "end"])
    body = {"prompt": f"storm {i} " * rng.randint(1, 20), "max_tokens": rng.randint(1, 64)}
    body["stream"] = rng.random() < 0.8
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
        if cut == "connect":
            try:
                await asyncio.wait_for(c.post("/v1/completions", json=body), rng.random() * 0.2)
            except asyncio.TimeoutError:
                pass
            return cut
        async with c.stream("POST", "/v1/completions", json=body) as resp:
            limit = rng.randint(0, 10) if cut == "events" else 10**9
            n = 0
            async for line in resp.aiter_lines():
                n += bool(line)
                if n > limit:
                    break
    return cut


async def _storm(url: str, headers: dict[str, str]) -> list[Any]:
    rng = random.Random(15)
    clients = [_storm_client(url, headers, random.Random(rng.random()), i) for i in range(200)]
    return await asyncio.wait_for(asyncio.gather(*clients, return_exceptions=True), 180)


def test_disconnect_storm_leaves_nothing_behind(guarded: Server) -> None:
    outcomes = asyncio.run(_storm(guarded.url, guarded.headers))
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors[:3]
    with guarded.client(timeout=60) as c:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = c.get("/get_server_info").json()
            stats = info["scheduler"]
            idle = stats["num_running_reqs"] == 0 and stats["num_waiting_reqs"] == 0
            if idle and info["num_pending_http_requests"] == 0:
                break
            time.sleep(0.25)
        else:
            raise AssertionError(f"requests left running after the storm: {info}")
        assert c.post("/flush_cache").status_code == 200
        info = c.get("/get_server_info").json()
    assert info["integrity_ok"] is True, info["integrity_error"]
    stats = info["scheduler"]
    assert stats["num_free_tokens"] == stats["max_total_tokens"], stats
    assert httpx.get(guarded.url + "/health", timeout=10).status_code == 200
