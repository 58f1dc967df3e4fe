"""``radixserve serve --dp-size N``: N radixserve workers behind SGLang's router or gateway.

Each worker is a whole radixserve server (its own scheduler, radix cache and model) on a free
loopback port, started in a process of its own; SGLang's model gateway ``smg`` or its
predecessor ``sglang-router`` (both in the optional extra ``radixserve[router]``; ``--router``
picks, by default smg where it is installed) then listens on the public host and port and
routes ``/generate`` and the OpenAI routes to them (``cache_aware`` by default: an approximate
radix tree per worker, so a conversation's turns go where its prefix is cached). No transport
or routing of our own.

Supervision, until SIGINT/SIGTERM: a worker that dies is reported and the rest keep serving
(the router's health checks take it out of rotation); if the router dies, or every worker,
everything stops and the command exits non-zero.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import multiprocessing
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from radixserve.config import ServerConfig
from radixserve.kv_events_config import KVEventsConfig
from radixserve.launch.dp_waits import RouterLog, free_ports, wait_healthy, wait_router_ready
from radixserve.launch.gateway_keys import gateway_access

logger = logging.getLogger("radixserve.dp")

ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "manual")
# the launcher module of each: the same command line (smg forked sglang-router's)
ROUTER_MODULES = {"smg": "smg.launch_router", "sglang-router": "sglang_router.launch_router"}
ROUTERS = ("auto", *ROUTER_MODULES)
TRANSPORTS = ("http", "grpc")  # grpc: SGLang's gRPC scheduler API (api/grpc/server.py), smg only
# the routers check each worker every 60 s and drop it after 3 failures: a dead local worker
# would take requests for 3 minutes. These drop it within about 10 s (--router-arg overrides).
HEALTH_CHECKS = {"--health-check-interval-secs": "5", "--health-failure-threshold": "2"}
INSTALL_HINT = "--dp-size > 1 needs SGLang's gateway or router: pip install 'radixserve[router]'"
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class DataParallelConfig:
    dp_size: int = 1
    router_policy: str = "cache_aware"
    threads_per_worker: int | None = None  # torch threads per worker (None: cores / dp_size)
    router_args: tuple[str, ...] = ()  # passed to the router's launcher as they are
    router: str = "auto"  # smg, sglang-router, or auto: smg where it is installed
    transport: str = "http"  # how the router reaches the workers

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"--router must be one of {ROUTERS}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"--worker-transport must be one of {TRANSPORTS}")
        if self.transport == "grpc" and self.router == "sglang-router":
            raise ValueError("--worker-transport grpc needs smg (--router smg or auto)")
        if self.dp_size < 1:
            raise ValueError("--dp-size must be >= 1")
        if self.router_policy not in ROUTER_POLICIES:
            raise ValueError(f"--router-policy must be one of {ROUTER_POLICIES}")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            raise ValueError("--threads-per-worker must be >= 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dp-size",
        type=int,
        default=1,
        help="data parallel: this many workers (scheduler, radix cache and model each) behind "
        "SGLang's router on --host/--port (needs radixserve[router])",
    )
    parser.add_argument(
        "--router-policy",
        choices=ROUTER_POLICIES,
        default="cache_aware",
        help="the router's policy with --dp-size > 1 (manual: route by a routing-key header)",
    )
    parser.add_argument(
        "--router",
        choices=ROUTERS,
        default="auto",
        help="with --dp-size > 1: SGLang's model gateway (smg) or its router (sglang-router); "
        "auto: smg where it is installed",
    )
    parser.add_argument(
        "--worker-transport",
        choices=TRANSPORTS,
        default="http",
        help="how the router reaches the workers with --dp-size > 1: http, or grpc (smg only: "
        "the gateway tokenizes, and cache_aware follows each worker's KV events)",
    )
    parser.add_argument(
        "--threads-per-worker",
        type=int,
        default=None,
        help="torch threads of each worker with --dp-size > 1 (default: cores / dp-size)",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for the router's launcher, e.g. "
        "--router-arg=--balance-abs-threshold=8 (repeatable)",
    )


def from_args(args: argparse.Namespace) -> DataParallelConfig:
    return DataParallelConfig(
        args.dp_size,
        args.router_policy,
        args.threads_per_worker,
        tuple(args.router_arg),
        args.router,
        args.worker_transport,
    )


def _installed(router: str) -> bool:
    return importlib.util.find_spec(ROUTER_MODULES[router].partition(".")[0]) is not None


def resolve_router(router: str) -> str:
    """``router`` itself if installed (``auto``: smg, else sglang-router); ``ValueError``
    with the install hint if not."""
    names = [r for r in ROUTER_MODULES if _installed(r)] if router == "auto" else [router]
    if not names or not _installed(names[0]):
        raise ValueError(f"{INSTALL_HINT} (--router {router} is not installed)")
    return names[0]


def worker_server_configs(
    config: ServerConfig, threads: int, ports: list[int], grpc_ports: list[int] | None = None
) -> list[ServerConfig]:
    """Each worker's config: loopback on its port, ``threads`` torch threads, and a file KV tier
    of its own (``<kv_tier_path>/dp<i>``: two workers mapping one file would overwrite each
    other's KV; each gets a tier of ``--kv-tier-size``), and its rank: its KV events carry it and
    go out on the ``--kv-events-config`` ports plus the rank, as SGLang's do. With
    ``grpc_ports`` each also serves gRPC there and, unless ``--kv-events-config`` says
    otherwise, publishes its KV events on a free loopback port (smg's gRPC relay reads them);
    without, each knows every worker's URL, where the Responses API's stored objects are
    (``api/responses/peers.py``; over gRPC smg holds them itself)."""
    out = []
    if grpc_ports is not None and config.engine.kv_events_config is None:
        loopback = [f"tcp://127.0.0.1:{p}" for p in free_ports(len(ports))]
        configs = [KVEventsConfig(publisher="zmq", endpoint=e, bind=True) for e in loopback]
    else:
        configs = None
    for i, port in enumerate(ports):
        engine = config.engine.replace(num_threads=threads, dp_rank=i)
        events = engine.kv_events
        if events is not None:  # SGLang's ports: the endpoints' plus the rank
            engine = engine.replace(kv_events_config=events.for_rank(i))
        if engine.kv_tier.kv_tier_path is not None:
            tier_path = str(Path(engine.kv_tier.kv_tier_path) / f"dp{i}")
            engine = engine.replace(kv_tier_path=tier_path)
        if configs is not None:  # (a port each: nothing to offset)
            engine = engine.replace(kv_events_config=configs[i])
        grpc_port = grpc_ports[i] if grpc_ports is not None else None
        peers = () if grpc_ports is not None else tuple(worker_urls(ports))
        out.append(
            dataclasses.replace(
                config,
                engine=engine,
                host="127.0.0.1",
                port=port,
                grpc_port=grpc_port,
                state_peers=peers,
            )
        )
    return out


def worker_urls(ports: list[int]) -> list[str]:
    """The workers' HTTP URLs: loopback, one port each."""
    return [f"http://127.0.0.1:{p}" for p in ports]


def serve_data_parallel(config: ServerConfig, dp: DataParallelConfig) -> int:
    """Start the workers and the router; supervise until a signal. Returns the exit code."""
    dp = dataclasses.replace(dp, router=resolve_router(dp.router))  # the hint if none is
    threads = dp.threads_per_worker or max(1, (multiprocessing.cpu_count() or 1) // dp.dp_size)
    ports = free_ports(dp.dp_size)
    grpc_ports = free_ports(dp.dp_size) if dp.transport == "grpc" else None
    try:
        access = gateway_access(config, dp.router, dp.transport)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    worker_configs = worker_server_configs(access.workers, threads, ports, grpc_ports)
    urls = worker_urls(ports)
    router_urls = urls if grpc_ports is None else [f"grpc://127.0.0.1:{p}" for p in grpc_ports]
    ctx = multiprocessing.get_context("spawn")
    workers: list[BaseProcess] = []
    router: subprocess.Popen[bytes] | None = None
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        for i, wc in enumerate(worker_configs):
            workers.append(ctx.Process(target=_run_worker, args=(wc,), name=f"radixserve-dp{i}"))
            workers[-1].start()
        deadline = time.monotonic() + config.startup_timeout_s
        for i, (worker, url) in enumerate(zip(workers, urls, strict=True)):
            if not wait_healthy(url, deadline, worker):
                logger.error("worker %d (%s) did not start", i, url)
                return 1
        router = subprocess.Popen(
            router_command(config, dp, router_urls, access.flags),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        router_log = RouterLog(router)
        router_url = f"http://{_connect_host(config.host)}:{config.port}"
        if not wait_router_ready(router_url, len(urls), deadline, router, access.control_key):
            code = router.poll()
            why = "timed out" if code is None else f"exited with code {code}"
            logger.error(
                "the router did not start or did not register the workers (%s); its last "
                "lines:\n%s",
                why,
                router_log.tail(),
            )
            return 1
        _print_ready(config, dp, router_urls)
        return _supervise(workers, urls, router)
    except KeyboardInterrupt:
        logger.info("stopping the router and %d workers", len(workers))
        return 0
    finally:
        signal.signal(signal.SIGTERM, old_term)
        _stop(workers, router)


def router_command(
    config: ServerConfig, dp: DataParallelConfig, urls: list[str], key_flags: Sequence[str] = ()
) -> list[str]:
    """The router's command line; ``key_flags``: its keys (``gateway_keys.gateway_access``)."""
    cmd = [sys.executable, "-m", ROUTER_MODULES[resolve_router(dp.router)]]
    cmd += ["--host", config.host, "--port", str(config.port), "--policy", dp.router_policy]
    cmd += ["--worker-urls", *urls, "--log-level", _router_log_level(config.log_level)]
    cmd += key_flags
    if dp.transport == "grpc":  # the gateway tokenizes: the checkpoint's tokenizer
        cmd += ["--model-path", str(config.engine.model_path)]
    given = {a.split("=")[0] for a in dp.router_args}
    if "--prometheus-port" not in given:
        # its default (29000) is fixed: a second --dp-size server on the machine would collide
        cmd += ["--prometheus-port", str(free_ports(1)[0])]
    for flag, value in HEALTH_CHECKS.items():
        if flag not in given:
            cmd += [flag, value]
    return cmd + list(dp.router_args)


def _run_worker(config: ServerConfig) -> None:
    from radixserve.launch.server import StartupError, launch_server
    from radixserve.server.ipc import LOG_FORMAT

    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops workers with SIGTERM
    try:
        code = launch_server(config)  # 1 when one of its children died: the launcher reports it
    except StartupError as exc:
        logging.getLogger("radixserve.dp").error("a worker could not start: %s", exc)
        code = 1
    sys.exit(code)


def _supervise(workers: list[BaseProcess], urls: list[str], router: subprocess.Popen[bytes]) -> int:
    reported: set[int] = set()
    while True:
        if router.poll() is not None:
            logger.error("the router exited with code %s: stopping the workers", router.returncode)
            return 1
        for i, proc in enumerate(workers):
            if proc.exitcode is not None and i not in reported:
                reported.add(i)
                logger.error(
                    "worker %d (%s) exited with code %s; the others keep serving",
                    i,
                    urls[i],
                    proc.exitcode,
                )
        if len(reported) == len(workers):
            logger.error("every worker has exited: stopping the router")
            return 1
        time.sleep(0.5)


def _stop(workers: list[BaseProcess], router: subprocess.Popen[bytes] | None) -> None:
    if router is not None and router.poll() is None:
        router.terminate()
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    if router is not None:
        try:
            router.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            router.kill()
    for proc in workers:
        proc.join(max(deadline - time.monotonic(), 0.1))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _router_log_level(level: str) -> str:
    return {"warning": "warn"}.get(level, level)


def _print_ready(config: ServerConfig, dp: DataParallelConfig, urls: list[str]) -> None:
    url = f"http://{_connect_host(config.host)}:{config.port}"
    body = f'{{"model": "{config.model_name}", "prompt": "def fibonacci(n):", "max_tokens": 16}}'
    print(
        f"radixserve is ready at {url}: {dp.router} ({dp.router_policy}) over "
        f"{len(urls)} workers: {' '.join(urls)}\n"
        f"try:\n  curl {url}/v1/completions -H 'Content-Type: application/json' -d '{body}'",
        flush=True,
    )
