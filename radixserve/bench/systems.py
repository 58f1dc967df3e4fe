"""Run the same sessions through every system of a benchmark, one system at a time.

Systems, in order: radixserve once per schedule policy; with ``kv_tier``, radixserve over the
same pool with a KV tier under its tree (``radixserve+tier``: a file tier in a temp dir, or host
memory); with ``max_total_tokens``, radixserve with its default (unbounded) pool for reference;
radixserve with the radix cache disabled (with a prefill calibration after each of its runs,
for the time model); Hugging Face transformers recomputing the history, and with its KV carried
across turns; another OpenAI-compatible server. Each starts only after the previous one has
stopped, so none competes for the cores.

With ``repeat`` > 1 each system replays the trace that many times back to back (its cache
flushed in between) and reports the fastest run, with every run's wall time beside it: on a
shared host, interference only ever adds time, so the minimum is the least disturbed figure.
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixserve.bench.clients import Client, EngineClient, HttpClient, OpenAIClient, RouterClient
from radixserve.bench.models import model_label
from radixserve.bench.prefill_cost import merge_calibrations
from radixserve.bench.records import optimal_hits, speculative_summary, summarize
from radixserve.bench.runner import Run, calibrate_prefill, fastest, host_load, run_sessions, warmup
from radixserve.bench.workload import Session, TokenSource, token_source
from radixserve.config import SCHEDULE_POLICIES, SpeculativeConfig

BASELINES = ("unbounded", "no-cache", "hf", "hf-kv")
BACKENDS = ("engine", "http", "frontend")
KV_TIERS = ("file", "host")
SERVER_INFO_KEYS = (
    "model_path",
    "dtype",
    "quantization",
    "schedule_policy",
    "disable_radix_cache",
    "max_total_tokens",
    "kv_tier_path",
    "enable_hierarchical_cache",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "enable_mixed_chunk",
)


@dataclass(frozen=True, slots=True)
class BenchOptions:
    model_path: str
    dtype: str = "bfloat16"
    device: str = "cpu"  # of every system: cpu, cuda or cuda:N
    quantization: str | None = None  # of the radixserve systems: None or int8 (weight-only)
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
    # real text through the model's tokenizer (bench.models.text_corpus), or None: random ids
    corpus: np.ndarray | None = field(default=None, repr=False, compare=False)
    repeat: int = 1  # runs per system; the fastest is reported
    dp_size: int = 1  # > 1: radixserve serve --dp-size behind sglang-router, per router policy
    router_policies: tuple[str, ...] = ("cache_aware", "round_robin")
    router_args: tuple[str, ...] = ()  # passed to the router (radixserve serve --router-arg)
    max_total_tokens: int | None = None  # the KV pool of the radixserve systems (None: default)
    kv_tier: str | None = None  # "file" or "host": also run radixserve+tier (docs/kv_tier.md)
    kv_tier_bytes: int | None = None  # the tier's size (None: the runtime's default, 2 pools)
    speculative_algorithm: str | None = None  # NGRAM: every radixserve system drafts
    speculative_num_draft_tokens: int | None = None  # None: the runtime's default
    enable_mixed_chunk: bool = False  # serve's flag: prefill steps carry the running requests

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
        if self.dp_size > 1 and (self.backend != "http" or self.url is not None):
            raise ValueError("--dp-size starts its own router: use --backend http, no --url")
        if self.kv_tier is not None and self.kv_tier not in KV_TIERS:
            raise ValueError(f"kv_tier must be one of {KV_TIERS}, got {self.kv_tier!r}")
        if self.kv_tier_bytes is not None and self.kv_tier is None:
            raise ValueError("--kv-tier-size needs --kv-tier")
        if (self.kv_tier or self.max_total_tokens) and self.url:
            raise ValueError("--kv-tier and --max-total-tokens start their own servers: no --url")
        if self.kv_tier and self.dp_size > 1:
            raise ValueError("--kv-tier is not passed to --dp-size workers")
        if "unbounded" in self.baselines and self.max_total_tokens is None:
            raise ValueError("the unbounded baseline is the reference of --max-total-tokens")
        if self.quantization is not None and {"hf", "hf-kv"} & set(self.baselines):
            raise ValueError(
                "the HF baselines have no int8 weights: --quantization needs --baselines "
                "without hf and hf-kv (e.g. none or no-cache)"
            )
        if self.quantization is not None and self.url is not None:
            raise ValueError("--quantization starts its own server: drop --url")
        if self.speculative() and self.url is not None:
            raise ValueError("--speculative-algorithm starts its own server: drop --url")
        if self.speculative_num_draft_tokens is not None and not self.speculative_algorithm:
            raise ValueError("--speculative-num-draft-tokens needs --speculative-algorithm")
        SpeculativeConfig(**self.speculative())  # its own checks, before any system starts

    def speculative(self) -> dict[str, Any]:
        """The radixserve systems' speculative settings as Engine keywords (``serve`` takes
        the same names as flags); empty with speculation off."""
        kw = {
            "speculative_algorithm": self.speculative_algorithm,
            "speculative_num_draft_tokens": self.speculative_num_draft_tokens,
        }
        return {k: v for k, v in kw.items() if v is not None}


@dataclass(frozen=True, slots=True)
class RadixSetup:
    """How one radixserve system runs: its policy, cache, pool and KV tier."""

    kind: str  # radixserve, kv-tier, unbounded, no-cache, data-parallel
    policy: str
    disable_cache: bool = False
    router_policy: str | None = None
    max_total_tokens: int | None = None
    kv_tier: str | None = None  # file (in a temp dir) or host
    kv_tier_bytes: int | None = None

    @classmethod
    def of(cls, opts: BenchOptions, kind: str, policy: str, **kw: Any) -> RadixSetup:
        pool = None if kind == "unbounded" else opts.max_total_tokens
        tier, size = (opts.kv_tier, opts.kv_tier_bytes) if kind == "kv-tier" else (None, None)
        return cls(kind, policy, max_total_tokens=pool, kv_tier=tier, kv_tier_bytes=size, **kw)

    def engine_kwargs(self, tier_dir: str | None) -> dict[str, Any]:
        """The Engine's keyword arguments beyond the model, dtype, quantization and policy."""
        kw: dict[str, Any] = {"disable_radix_cache": self.disable_cache}
        if self.max_total_tokens is not None:
            kw["max_total_tokens"] = self.max_total_tokens
        if self.kv_tier == "file":
            kw["kv_tier_path"] = tier_dir
        elif self.kv_tier == "host":
            kw["enable_hierarchical_cache"] = True
        if self.kv_tier_bytes is not None:
            kw["kv_tier_bytes"] = self.kv_tier_bytes
        return kw

    def serve_args(self, tier_dir: str | None) -> tuple[str, ...]:
        """The same as ``radixserve serve`` flags (the cache switch aside)."""
        args: tuple[str, ...] = ()
        if self.max_total_tokens is not None:
            args += ("--max-total-tokens", str(self.max_total_tokens))
        if self.kv_tier == "file":
            assert tier_dir is not None
            args += ("--kv-tier-path", tier_dir)
        elif self.kv_tier == "host":
            args += ("--enable-hierarchical-cache",)
        if self.kv_tier_bytes is not None:
            args += ("--kv-tier-size", str(self.kv_tier_bytes))
        return args


def run_all(opts: BenchOptions, sessions: list[Session]) -> dict[str, Any]:
    """Every system's summary, and the no-cache run's prefill calibration (or None)."""
    systems: list[dict[str, Any]] = []
    first = opts.policies[0]
    if opts.dp_size > 1:
        for rp in opts.router_policies:
            name = f"radixserve-dp{opts.dp_size}[{rp}]"
            setup = RadixSetup.of(opts, "data-parallel", first, router_policy=rp)
            systems.append(_run_radixserve(opts, sessions, name, setup))
    else:
        for policy in opts.policies:
            name = "radixserve" if len(opts.policies) == 1 else f"radixserve[{policy}]"
            setup = RadixSetup.of(opts, "radixserve", policy)
            systems.append(_run_radixserve(opts, sessions, name, setup))
        if opts.kv_tier is not None:
            name = "radixserve+tier" if len(opts.policies) == 1 else f"radixserve+tier[{first}]"
            setup = RadixSetup.of(opts, "kv-tier", first)
            systems.append(_run_radixserve(opts, sessions, name, setup))
    if "unbounded" in opts.baselines:
        setup = RadixSetup.of(opts, "unbounded", first)
        systems.append(_run_radixserve(opts, sessions, "radixserve-unbounded", setup))
    calibration = None
    if "no-cache" in opts.baselines:
        setup = RadixSetup.of(opts, "no-cache", first, disable_cache=True)
        entry = _run_radixserve(opts, sessions, "radixserve-no-cache", setup)
        calibration = entry.pop("calibration")
        systems.append(entry)
    hf_modes = [(m, m == "hf-kv") for m in ("hf", "hf-kv") if m in opts.baselines]
    if hf_modes:
        from radixserve.bench.hf_baseline import HFRunner

        runner = HFRunner(opts.model_path, opts.dtype, opts.num_threads, opts.device)
        try:
            runner.warmup()
            for mode, carry in hf_modes:
                name = "hf-kv-carried" if carry else "hf-recompute"
                load = host_load()

                def run_hf(c: bool = carry, n: str = name) -> Run:
                    records, wall = runner.run(sessions, opts.hf_batch_size, c, n)
                    return records, wall, None

                (records, wall, _), walls = fastest(opts.repeat, run_hf, lambda: None)
                extra: dict[str, Any] = {"kind": mode, "wall_runs_s": walls, **load}
                systems.append(summarize(name, records, wall, extra))
        finally:
            runner.close()
    if opts.compare_url:
        client = OpenAIClient(opts.compare_url, opts.compare_model)
        try:
            warmup(client, _warmup_source(opts))
            load = host_load()
            # run once: another server's cache cannot be flushed from here, and a replay would
            # hit what the first run left in it
            records, wall, _ = run_sessions(client, sessions, opts.parallel, "compare")
            served_model = model_label(client.model)  # llama-server's id is its GGUF's path
            extra = {"kind": "compare", "url": opts.compare_url, "model": served_model}
            extra.update(load)
            # without output ids the history carries the trace's fallback answers, which the
            # server never generated: its cache cannot hit them, the optimal counts them
            extra["returned_token_ids"] = client.saw_token_ids
            systems.append(summarize(f"compare[{served_model}]", records, wall, extra))
        finally:
            client.close()
    return {"systems": systems, "calibration": calibration}


def _warmup_source(opts: BenchOptions) -> TokenSource:
    return token_source(*opts.token_range, seed=12345, corpus=opts.corpus)


def _run_radixserve(
    opts: BenchOptions, sessions: list[Session], name: str, setup: RadixSetup
) -> dict[str, Any]:
    policy, disable_cache = setup.policy, setup.disable_cache
    extra: dict[str, Any] = {
        "kind": setup.kind,
        "policy": policy,
        "backend": opts.backend,
        "max_total_tokens": setup.max_total_tokens,
    }
    if setup.router_policy is not None:
        extra.update(dp_size=opts.dp_size, router_policy=setup.router_policy)
    if setup.kv_tier is not None:
        extra.update(kv_tier=setup.kv_tier, kv_tier_bytes=setup.kv_tier_bytes)
    src = _warmup_source(opts)
    with _client(opts, setup) as (client, url):
        warmup(client, src)
        if isinstance(client, HttpClient):  # what the server says it runs
            info = client.server_info()
            extra["server"] = {k: info.get(k) for k in SERVER_INFO_KEYS}
            extra["policy"] = info.get("schedule_policy", policy)
            extra["quantization"] = info.get("quantization")
        elif isinstance(client, EngineClient):  # what it was configured with
            flat = client.engine.config.flat()
            extra["server"] = {k: flat.get(k) for k in SERVER_INFO_KEYS}
            extra["quantization"] = flat["quantization"]
        extra.update(host_load())
        if (now := client.stats()) is not None:  # the pool (and tier) it got, in tokens
            extra["pool_tokens"] = now.get("max_total_tokens")
            extra["kv_tier_capacity_tokens"] = now.get("kv_tier_capacity_tokens")

        calibrations: list[dict[str, Any]] = []

        def run() -> Run:
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

        finished_before = _finished_per_worker(client)
        (records, wall, stats), walls = fastest(opts.repeat, run, client.flush)
        if finished_before is not None:  # the share of the requests each worker served
            after = _finished_per_worker(client) or []
            served = [a - b for a, b in zip(after, finished_before, strict=True)]
            extra["load_split"] = [n / max(sum(served), 1) for n in served]
        extra["server_stats"] = stats
        extra["speculative"] = speculative_summary(stats) if opts.speculative() else None
        extra["wall_runs_s"] = walls
        if disable_cache:
            extra["calibration"] = merge_calibrations(calibrations)
    return summarize(name, records, wall, extra)


def _finished_per_worker(client: Client) -> list[int] | None:
    if not isinstance(client, RouterClient):
        return None
    return [int(w["num_finished_reqs"]) for w in client.worker_stats()]


@contextlib.contextmanager
def _client(opts: BenchOptions, setup: RadixSetup) -> Iterator[tuple[Client, str | None]]:
    """The client of one radixserve system (and its URL over HTTP), stopped on exit; a file
    tier lives in a temp dir removed afterwards."""
    with contextlib.ExitStack() as stack:
        tier_dir = None
        if setup.kv_tier == "file":
            tier_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kv-tier-"))
        yield stack.enter_context(_started(opts, setup, tier_dir))


@contextlib.contextmanager
def _started(
    opts: BenchOptions, setup: RadixSetup, tier_dir: str | None
) -> Iterator[tuple[Client, str | None]]:
    if opts.backend == "engine":
        from radixserve.server.engine import Engine

        threads: dict[str, Any] = (
            {} if opts.num_threads is None else {"num_threads": opts.num_threads}
        )
        engine = Engine(
            opts.model_path,
            dtype=opts.dtype,
            device=opts.device,
            quantization=opts.quantization,
            schedule_policy=setup.policy,
            **setup.engine_kwargs(tier_dir),
            **opts.speculative(),
            **threads,
            enable_mixed_chunk=opts.enable_mixed_chunk,
        )
        try:
            yield EngineClient(engine), None
        finally:
            engine.shutdown()
            del engine
            gc.collect()
        return
    if opts.url is not None and setup.kind == "radixserve":
        http = HttpClient(opts.url)
        try:
            yield http, opts.url
        finally:
            http.close()
        return
    from radixserve.bench.servers import launched_server

    router_policy = setup.router_policy
    extra_args = setup.serve_args(tier_dir) + ("--device", opts.device)
    if opts.quantization is not None:
        extra_args += ("--quantization", opts.quantization)
    for key, value in opts.speculative().items():
        extra_args += ("--" + key.replace("_", "-"), str(value))
    if opts.enable_mixed_chunk:
        extra_args += ("--enable-mixed-chunk",)
    grpc = False
    if router_policy is not None:  # "cache_aware:grpc": smg over gRPC workers (KV events)
        router_policy, _, transport = router_policy.partition(":")
        grpc = transport == "grpc"
        worker_threads = str(opts.num_threads or 1)
        extra_args += ("--dp-size", str(opts.dp_size), "--router-policy", router_policy)
        if grpc:
            extra_args += ("--worker-transport", "grpc", "--router", "smg")
        extra_args += ("--threads-per-worker", worker_threads)
        extra_args += tuple(f"--router-arg={a}" for a in opts.router_args)
    with launched_server(
        opts.model_path,
        opts.dtype,
        setup.policy,
        setup.disable_cache,
        opts.num_threads,
        extra_args,
    ) as url:
        if router_policy is not None:
            from radixserve.launch.dp_waits import wait_router_ready

            deadline = time.monotonic() + 600
            if not wait_router_ready(url, opts.dp_size, deadline):
                raise RuntimeError(f"the router at {url} did not register {opts.dp_size} workers")
        http = RouterClient(url, grpc) if router_policy is not None else HttpClient(url)
        try:
            yield http, url
        finally:
            http.close()
