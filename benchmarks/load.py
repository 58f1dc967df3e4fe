"""Load against a running server: N streaming clients for T seconds, and a health probe.

    .venv/bin/python benchmarks/load.py --url http://127.0.0.1:30000 --clients 64 --seconds 60

Each client loops: one streaming ``/v1/completions`` (a random prompt of 8-64 words, 16-64 new
tokens, ``ignore_eos``), reads it to ``[DONE]``, then the next, until the time is up. Beside
them one probe, in a process of its own, GETs ``/health`` every 50 ms. Afterwards: requests/s, errors, p50/p99 latency
and TTFT, ``/health`` p50/p99/max, and the scheduler's KV integrity check from
``/get_server_info`` once the server is idle again (after ``/flush_cache``: the pool must be
back to full). Exits 1 if any request failed, the integrity check failed, or the health p99
is over ``--health-p99-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
HEALTH_INTERVAL_S = 0.05


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    completion_tokens: int = 0


def pct_ms(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q / 100 * len(ordered)), len(ordered) - 1)] * 1000.0, 1)


async def one_request(c: httpx.AsyncClient, rng: random.Random, model: str, t: Tally) -> None:
    body = {
        "model": model,
        "prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 64))),
        "max_tokens": rng.randint(16, 64),
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    first: float | None = None
    done = False
    async with c.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            t.errors.append(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True  # read on to the end: the connection goes back to the pool
                continue
            event = json.loads(data)
            if "error" in event:
                t.errors.append(f"error event: {event['error']}")
                return
            if first is None and event.get("choices"):
                first = time.monotonic()
            if event.get("usage"):
                t.completion_tokens += event["usage"]["completion_tokens"]
    if not done:
        t.errors.append("stream ended without [DONE]")
        return
    t.latencies.append(time.monotonic() - start)
    if first is not None:
        t.ttfts.append(first - start)


async def client_loop(
    url: str, headers: dict[str, str], model: str, seed: int, until: float, t: Tally
) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
        while time.monotonic() < until:
            try:
                await one_request(c, rng, model, t)
            except httpx.HTTPError as exc:
                t.errors.append(f"{type(exc).__name__}: {exc}")


def health_probe(url: str, seconds: float, out: Any) -> None:
    """In its own process, so the clients' event loop does not delay the probe: puts the
    list of latencies and the list of errors on ``out``."""
    latencies: list[float] = []
    errors: list[str] = []
    until = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as c:
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                resp = c.get("/health")
                if resp.status_code != 200:
                    errors.append(f"/health answered {resp.status_code}")
            except httpx.HTTPError as exc:
                errors.append(f"/health: {exc!r}")
            latencies.append(time.monotonic() - start)
            time.sleep(HEALTH_INTERVAL_S)
    out.put((latencies, errors))


async def run(args: argparse.Namespace) -> tuple[Tally, float]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=30) as c:
        model = (await c.get("/v1/models")).json()["data"][0]["id"]
    t = Tally()
    ctx = multiprocessing.get_context("spawn")
    probe_out = ctx.Queue()
    probe = ctx.Process(target=health_probe, args=(args.url, args.seconds, probe_out))
    probe.start()
    start = time.monotonic()
    until = start + args.seconds
    tasks = [client_loop(args.url, headers, model, i, until, t) for i in range(args.clients)]
    await asyncio.gather(*tasks)
    wall = time.monotonic() - start
    t.health, probe_errors = await asyncio.to_thread(probe_out.get, True, args.seconds + 60)
    t.errors += probe_errors
    probe.join(10)
    return t, wall


def integrity(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """Wait for the server to idle, flush the cache, then run the KV integrity check."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = c.get("/get_server_info").json()["scheduler"]
            if stats["num_running_reqs"] == 0 and stats["num_waiting_reqs"] == 0:
                break
            time.sleep(0.25)
        c.post("/flush_cache")
        info = c.get("/get_server_info").json()
    stats = info["scheduler"]
    return {
        "integrity_ok": info["integrity_ok"],
        "integrity_error": info["integrity_error"],
        "pool_full": stats["num_free_tokens"] == stats["max_total_tokens"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--health-p99-ms", type=float, default=100.0)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    t, wall = asyncio.run(run(args))
    load_after = os.getloadavg()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    check = integrity(args.url, headers)
    ms = 1000.0
    report = {
        "clients": args.clients,
        "seconds": round(wall, 1),
        "requests": len(t.latencies),
        "requests_per_s": round(len(t.latencies) / wall, 2),
        "output_tokens_per_s": round(t.completion_tokens / wall, 1),
        "errors": len(t.errors),
        "latency_p50_ms": pct_ms(t.latencies, 50),
        "latency_p99_ms": pct_ms(t.latencies, 99),
        "ttft_p50_ms": pct_ms(t.ttfts, 50),
        "ttft_p99_ms": pct_ms(t.ttfts, 99),
        "health_probes": len(t.health),
        "health_p50_ms": pct_ms(t.health, 50),
        "health_p99_ms": pct_ms(t.health, 99),
        "health_max_ms": pct_ms(t.health, 100),
        "load_avg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "cpus": os.cpu_count(),
        **check,
    }
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    for err in t.errors[:5]:
        print("error:", err, file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            mean = statistics.fmean(t.latencies) * ms if t.latencies else None
            json.dump({**report, "mean_latency_ms": mean}, f)
    bad = t.errors or not check["integrity_ok"] or not check["pool_full"]
    health_p99 = report["health_p99_ms"]
    return 1 if bad or health_p99 is None or health_p99 > args.health_p99_ms else 0


if __name__ == "__main__":
    sys.exit(main())
