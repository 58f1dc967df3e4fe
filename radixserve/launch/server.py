"""Launching the server: the scheduler and detokenizer processes, then uvicorn here.

``launch_server`` spawns both children (``multiprocessing``'s spawn context: a fresh
interpreter each, no forked torch or zmq state) with IPC sockets in a private temp dir: the
scheduler first, then, once this process has loaded the tokenizer, the detokenizer with the
tokenizer's decoder (it then imports neither transformers nor torch), waits
for their ready handshakes (the scheduler's carries the model's limits), then serves HTTP in
this process until SIGINT/SIGTERM. However it ends, the children are stopped and the temp dir
removed; a child whose parent is killed outright notices and exits by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import TYPE_CHECKING, Any

from radixserve.config import ServerConfig
from radixserve.runtime.default_model import DESCRIPTION as DEFAULT_MODEL_DESCRIPTION
from radixserve.server.detokenizer_process import run_detokenizer_process
from radixserve.server.io_struct import SchedulerInfo
from radixserve.server.ipc import IpcEndpoints
from radixserve.tokenizer_loader import decoder_json, load_tokenizer

if TYPE_CHECKING:
    import uvicorn

    from radixserve.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger("radixserve.server")

CHILD_STOP_TIMEOUT_S = 5.0
DEAD_CHILD_GRACE_S = 1.0  # after a child dies: time to send the in-flight requests their 503s
SUPERVISE_INTERVAL_S = 0.1
KEEP_ALIVE_S = 75  # seconds an idle keep-alive connection stays open (nginx's default)


class StartupError(RuntimeError):
    """A child process failed to start (the message says why)."""


class _Terminated(Exception):
    """SIGTERM arrived: stop like Ctrl-C does."""


def launch_server(config: ServerConfig) -> int:
    """Run the server until SIGINT/SIGTERM or a child's death; returns the exit code: 0 after
    a clean stop, 1 when a child process died (the log says which and why). KeyboardInterrupt
    may escape on SIGINT. Raises StartupError if a child fails to start."""
    ipc_dir = tempfile.mkdtemp(prefix="radixserve-ipc-")
    endpoints = IpcEndpoints.in_dir(ipc_dir)
    children: dict[str, BaseProcess] = {}
    # uvicorn takes SIGTERM over while it serves and re-raises it to this handler afterwards
    old_term = signal.signal(signal.SIGTERM, _raise_terminated)
    code = 0
    try:
        pipes, tokenizer = _start_children(config, endpoints, children)
        # the HTTP side imports torch: here, once the scheduler has started (radixserve/cli.py)
        import uvicorn

        from radixserve.api.app import create_app
        from radixserve.api.operator.server_info import speculating
        from radixserve.api.operator.tenant_metrics import MetricsByTenant
        from radixserve.launch.connections import ConnectionLimits, guarded_protocol
        from radixserve.server.tokenizer_manager import TokenizerManager

        info = _wait_children(config, children, pipes)
        metrics = MetricsByTenant(config.model_name, speculating(config))
        tm = TokenizerManager(
            config, endpoints, info, tokenizer, children=children, observer=metrics
        )
        app = create_app(tm, config, metrics)
        limits = ConnectionLimits.default(
            config.max_connections,
            config.request_header_timeout_s,
            config.request_body_timeout_s,
            config.min_request_body_rate,
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=config.host,
                port=config.port,
                log_level=config.log_level,
                # longer than clients keep idle connections (httpx 5 s, aiohttp 15 s): the client
                # closes first, so it never sends on a connection the server is closing (a
                # ReadError); under pressure the connection cap sheds idle ones anyway
                timeout_keep_alive=KEEP_ALIVE_S,
                http=guarded_protocol(limits),
                backlog=limits.backlog,
                # the drain (_supervise) ends every request first; this is a backstop
                timeout_graceful_shutdown=int(config.graceful_shutdown_timeout_s) + 5,
            )
        )
        code = asyncio.run(_serve(server, config, info, tm))
    except _Terminated:
        logger.info("SIGTERM: shutting down")
    finally:
        signal.signal(signal.SIGTERM, old_term)
        _stop_children(children)
        shutil.rmtree(ipc_dir, ignore_errors=True)
        logger.info("radixserve stopped" + (f" (exit code {code})" if code else ""))
    return code


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def _start_children(
    config: ServerConfig, endpoints: IpcEndpoints, children: dict[str, BaseProcess]
) -> tuple[dict[str, Connection], Any]:
    """Start the scheduler, load the tokenizer here while it starts, then the detokenizer with
    the tokenizer's decoder (so that it needs no transformers of its own); their ready pipes
    and the tokenizer (``None`` if it failed to load here)."""
    model_path = config.engine.model_path
    assert model_path is not None
    pipes: dict[str, Connection] = {}
    _start_child("scheduler", _run_scheduler, (config.engine, endpoints), config, children, pipes)
    logger.info("loading %s in the scheduler process", model_path)
    tokenizer = _early_tokenizer(config)
    decoder = _decoder(tokenizer)
    args = (model_path, decoder, endpoints)
    _start_child("detokenizer", run_detokenizer_process, args, config, children, pipes)
    return pipes, tokenizer


def _run_scheduler(*args: Any) -> None:
    """The scheduler child's entry: its module (and torch) imported there, not here."""
    from radixserve.server.scheduler_process import run_scheduler_process

    run_scheduler_process(*args)


def _start_child(
    name: str,
    target: Any,
    args: tuple[Any, ...],
    config: ServerConfig,
    children: dict[str, BaseProcess],
    pipes: dict[str, Connection],
) -> None:
    """Start child ``name`` (``multiprocessing``'s spawn context) into ``children``, its ready
    pipe into ``pipes``."""
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=target,
        args=(*args, writer, os.getpid(), config.log_level),
        name=f"radixserve-{name}",
        # a daemonic process may not start children: the tensor-parallel ranks are the
        # scheduler's (it stops them; _stop_children stops it however this process ends)
        daemon=not (name == "scheduler" and config.engine.parallel.tp_size > 1),
    )
    proc.start()
    writer.close()
    children[name], pipes[name] = proc, reader


def _early_tokenizer(config: ServerConfig) -> Any:
    """The tokenizer, loaded here while the scheduler starts (off the start-up's critical
    path); ``None`` if it fails, so that the children's own report of the failure is what the
    user reads."""
    assert config.engine.model_path is not None
    try:
        return load_tokenizer(config.engine.model_path)
    except Exception:
        return None


def _decoder(tokenizer: Any) -> str | None:
    """What the detokenizer decodes with (:func:`decoder_json`); ``None``: it loads the
    tokenizer itself (no tokenizer here, or one only transformers decodes)."""
    if tokenizer is None:
        return None
    try:
        return decoder_json(tokenizer)
    except Exception:
        logger.debug("the detokenizer loads its own tokenizer", exc_info=True)
        return None


def _wait_children(
    config: ServerConfig, children: dict[str, BaseProcess], pipes: dict[str, Connection]
) -> SchedulerInfo:
    """Wait until every child is ready (:class:`StartupError` if one fails); the scheduler's
    :class:`SchedulerInfo`."""
    ready = {name: _wait_ready(name, children[name], pipes[name], config) for name in children}
    info = ready["scheduler"]
    assert isinstance(info, SchedulerInfo)
    return info


def _wait_ready(name: str, proc: BaseProcess, pipe: Connection, config: ServerConfig) -> object:
    deadline = time.monotonic() + config.startup_timeout_s
    while time.monotonic() < deadline:
        if pipe.poll(0.2):
            try:
                msg = pipe.recv()
            except EOFError:
                msg = None
            if isinstance(msg, str) and msg != "ready":
                raise StartupError(msg)
            if msg is not None:
                return msg
        if proc.exitcode is not None:
            raise StartupError(f"the {name} process exited with code {proc.exitcode}")
    raise StartupError(f"the {name} process was not ready after {config.startup_timeout_s} s")


def _stop_children(children: dict[str, BaseProcess]) -> None:
    for proc in children.values():
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + CHILD_STOP_TIMEOUT_S
    for name, proc in children.items():
        proc.join(max(deadline - time.monotonic(), 0.1))
        if proc.is_alive():
            logger.warning("the %s process did not stop on SIGTERM: killing it", name)
            proc.kill()
            proc.join(1.0)


async def _serve(
    server: uvicorn.Server, config: ServerConfig, info: SchedulerInfo, tm: TokenizerManager
) -> int:
    from radixserve.launch.connections import throttle_accept_errors

    throttle_accept_errors(asyncio.get_running_loop())
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        _print_ready(config, info)
    supervisor = asyncio.create_task(_supervise(server, config, tm))
    try:
        await task
    finally:
        if not supervisor.done():
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
    return 0 if supervisor.cancelled() else supervisor.result()


async def _supervise(server: uvicorn.Server, config: ServerConfig, tm: TokenizerManager) -> int:
    """Ends the server when a child process dies (exit code 1: a server that cannot generate
    must not hold its port), and drains it when uvicorn is told to stop (SIGTERM, SIGINT):
    uvicorn stops accepting while the requests in flight finish or are ended (0)."""
    while not server.should_exit:
        if not tm.is_alive:
            reason = (tm.dead_reason or "").splitlines()[0]
            logger.error("%s: the server exits with code 1", reason)
            await asyncio.sleep(DEAD_CHILD_GRACE_S)  # the in-flight requests get their 503s
            server.should_exit = True
            return 1
        await asyncio.sleep(SUPERVISE_INTERVAL_S)
    await tm.drain(config.graceful_shutdown_timeout_s)
    return 0


def _print_ready(config: ServerConfig, info: SchedulerInfo) -> None:
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    url = f"http://{host}:{config.port}"
    auth = " -H 'Authorization: Bearer <your --api-key>'" if config.api_key else ""
    body = f'{{"model": "{config.model_name}", "prompt": "def fibonacci(n):", "max_tokens": 16}}'
    lines = [
        f"radixserve is ready at {url}: model {config.model_name!r} "
        f"({info.max_context_len} context, {info.max_total_tokens} KV slots)",
    ]
    if config.is_default_model:
        lines.append(
            f"NOTE: this is the embedded {DEFAULT_MODEL_DESCRIPTION}; pass --model DIR to serve "
            "a real Hugging Face checkpoint"
        )
    lines += [
        "try:",
        f"  curl {url}/v1/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
    ]
    print("\n".join(lines), flush=True)
    sys.stdout.flush()
