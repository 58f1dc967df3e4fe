"""Run the same sessions through every system of a benchmark, one system at a time.

Systems, in order: radixserve once per schedule policy; radixserve with the radix cache
disabled (with a prefill calibration after each of its runs, for the time model); Hugging
Face transformers recomputing the history, and with its KV carried across turns; another
OpenAI-compatible server. Each starts only after the previous one has stopped, so none
competes for the cores.

With ``repeat`` > 1 each system replays the trace that many times back to back (its cache
flushed in between) and reports the fastest run, with every run's wall time beside it: on a
shared host, interference only ever adds time, so the minimum is the least disturbed figure.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from radixserve.bench.clients import Client, EngineClient, HttpClient, OpenAIClient
from radixserve.bench.prefill_cost import merge_calibrations
from radixserve.bench.records import RequestRecord, optimal_hits, summarize
from radixserve.bench.runner import calibrate_prefill, run_sessions, warmup
from radixserve.bench.workload import Session, TokenSource
from radixserve.config import SCHEDULE_POLICIES

BASELINES = ("no-cache", "hf", "hf-kv")
BACKENDS = ("engine", "http", "frontend")
SERVER_INFO_KEYS = ("model_path", "dtype", "schedule_policy", "disable_radix_cache")


@dataclass(frozen=True, slots=True)
class BenchOptions:
    model_path: str
    dtype: str = "bfloat16"
    backend: str = "engine"  # engine: in-process; http: raw /generate; frontend: RuntimeEndpoint
    url: str | None = None  # a running radixserve server for the cached runs (else one starts)
    policies: tuple[str, ...] = ("fcfs",)
    baselines: tuple[str, ...] = BASELINES
    compare_url: str | None = None
    compare_model: str | None = None
    parallel: int = 8
    hf_batch_size: int = 8
    num_threads: int | None = None  # torch threads of every system (None: torch's default)
    token_range: tuple[int, int] = (3, 2048)
    repeat: int = 1  # runs per system; the fastest is reported

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {self.repeat}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        bad = [p for p in self.policies if p not in SCHEDULE_POLICIES]
        if bad or not self.policies:
            raise ValueError(f"policies must be among {SCHEDULE_POLICIES}, got {bad}")
        unknown = set(self.baselines) - set(BASELINES)
        if unknown:
            raise ValueError(f"unknown baselines {sorted(unknown)}; choose from {BASELINES}")
        if self.url is not None and len(self.policies) > 1:
            raise ValueError("a policy sweep starts its own servers: drop --url")
        if self.backend == "engine" and self.url is not None:
            raise ValueError("--url needs --backend http or frontend")


def _load() -> dict[str, float]:
    # a busy host skews a system's numbers: the report keeps the load each one started at
    return {"loadavg_1m_at_start": os.getloadavg()[0]}


_Run = tuple[list[RequestRecord], float, Any]


def _fastest(
    repeat: int, run: Callable[[], _Run], before: Callable[[], None]
) -> tuple[_Run, list[float]]:
    """The fastest of ``repeat`` runs (``before`` runs ahead of each but the first), and every
    run's wall time."""
    best: _Run | None = None
    walls: list[float] = []
    for i in range(repeat):
        if i:
            before()
        result = run()
        walls.append(result[1])
        if best is None or result[1] < best[1]:
            best = result
    assert best is not None
    return best, walls


def run_all(opts: BenchOptions, sessions: list[Session]) -> dict[str, Any]:
    """Every system's summary, and the no-cache run's prefill calibration (or None)."""
    systems: list[dict[str, Any]] = []
    for policy in opts.policies:
        name = "radixserve" if len(opts.policies) == 1 else f"radixserve[{policy}]"
        systems.append(_run_radixserve(opts, sessions, name, policy, disable_cache=False))
    calibration = None
    if "no-cache" in opts.baselines:
        entry = _run_radixserve(
            opts, sessions, "radixserve-no-cache", opts.policies[0], disable_cache=True
        )
        calibration = entry.pop("calibration")
        systems.append(entry)
    hf_modes = [(m, m == "hf-kv") for m in ("hf", "hf-kv") if m in opts.baselines]
    if hf_modes:
        from radixserve.bench.hf_baseline import HFRunner

        runner = HFRunner(opts.model_path, opts.dtype, opts.num_threads)
        try:
            runner.warmup()
            for mode, carry in hf_modes:
                name = "hf-kv-carried" if carry else "hf-recompute"
                load = _load()

                def run_hf(c: bool = carry, n: str = name) -> _Run:
                    records, wall = runner.run(sessions, opts.hf_batch_size, c, n)
                    return records, wall, None

                (records, wall, _), walls = _fastest(opts.repeat, run_hf, lambda: None)
                extra: dict[str, Any] = {"kind": mode, "wall_runs_s": walls, **load}
                systems.append(summarize(name, records, wall, extra))
        finally:
            runner.close()
    if opts.compare_url:
        client = OpenAIClient(opts.compare_url, opts.compare_model)
        try:
            warmup(client, _warmup_source(opts))
            load = _load()
            # run once: another server's cache cannot be flushed from here, and a replay would
            # hit what the first run left in it
            records, wall, _ = run_sessions(client, sessions, opts.parallel, "compare")
            extra = {"kind": "compare", "url": opts.compare_url, "model": client.model}
            extra.update(load)
            # without output ids the history carries the trace's fallback answers, which the
            # server never generated: its cache cannot hit them, the optimal counts them
            extra["returned_token_ids"] = client.saw_token_ids
            systems.append(summarize(f"compare[{client.model}]", records, wall, extra))
        finally:
            client.close()
    return {"systems": systems, "calibration": calibration}


def _warmup_source(opts: BenchOptions) -> TokenSource:
    return TokenSource(*opts.token_range, seed=12345)


def _run_radixserve(
    opts: BenchOptions, sessions: list[Session], name: str, policy: str, disable_cache: bool
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "kind": "no-cache" if disable_cache else "radixserve",
        "policy": policy,
        "backend": opts.backend,
    }
    src = _warmup_source(opts)
    with _client(opts, policy, disable_cache) as (client, url):
        warmup(client, src)
        if isinstance(client, HttpClient):  # what the server says it runs
            info = client.server_info()
            extra["server"] = {k: info.get(k) for k in SERVER_INFO_KEYS}
            extra["policy"] = info.get("schedule_policy", policy)
        extra.update(_load())

        calibrations: list[dict[str, Any]] = []

        def run() -> _Run:
            if opts.backend == "frontend":
                from radixserve.bench.frontend_driver import run_frontend

                assert url is not None
                result = run_frontend(url, opts.model_path, sessions, opts.parallel, name)
            else:
                result = run_sessions(client, sessions, opts.parallel, name)
            if disable_cache:  # right after each run, so the fastest of each meet
                longest = max(optimal_hits(result[0]), default=0)
                calibrations.append(calibrate_prefill(client, src, longest))
            return result

        (records, wall, stats), walls = _fastest(opts.repeat, run, client.flush)
        extra["server_stats"] = stats
        extra["wall_runs_s"] = walls
        if disable_cache:
            extra["calibration"] = merge_calibrations(calibrations)
    return summarize(name, records, wall, extra)


@contextlib.contextmanager
def _client(
    opts: BenchOptions, policy: str, disable_cache: bool
) -> Iterator[tuple[Client, str | None]]:
    """The client of one radixserve system (and its URL over HTTP), stopped on exit."""
    if opts.backend == "engine":
        from radixserve.server.engine import Engine

        threads = {} if opts.num_threads is None else {"num_threads": opts.num_threads}
        engine = Engine(
            opts.model_path,
            dtype=opts.dtype,
            schedule_policy=policy,
            disable_radix_cache=disable_cache,
            **threads,
        )
        try:
            yield EngineClient(engine), None
        finally:
            engine.shutdown()
            del engine
            gc.collect()
        return
    if opts.url is not None and not disable_cache:
        http = HttpClient(opts.url)
        try:
            yield http, opts.url
        finally:
            http.close()
        return
    from radixserve.bench.servers import launched_server

    with launched_server(
        opts.model_path, opts.dtype, policy, disable_cache, opts.num_threads
    ) as url:
        http = HttpClient(url)
        try:
            yield http, url
        finally:
            http.close()
