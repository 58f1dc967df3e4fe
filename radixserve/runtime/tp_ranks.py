"""TensorParallelRanks: rank 0's handle on the other ranks of a tensor-parallel model.

Rank 0 is the process of the scheduler (the Engine's, or the server's scheduler process). It
starts ranks ``1 .. tp_size - 1`` with ``torch.multiprocessing`` (spawn: a fresh interpreter
each, running :func:`radixserve.runtime.tp_worker.run_tp_worker`, which the caller of
:meth:`TensorParallelRanks.start` hands in), and all ranks meet on a ``TCPStore`` that rank 0
hosts on a free local port. Each rank then builds two c10d backends
(no default process group, so nothing process-wide and several engines per process are fine):

- ``control``: gloo, CPU tensors, for the batch broadcast (``tp_batch.py``). The other ranks
  wait on it as long as rank 0 idles; rank 0's sends time out after ``tp_timeout_s``.
- the model's group (:class:`TPGroup`): gloo on CPU, NCCL on CUDA, every collective bounded
  by ``tp_timeout_s``.

Failures: a rank that dies closes its connections, so rank 0's next collective raises at once
(and :meth:`check_alive` names the rank and its exit code first); a rank that hangs makes rank
0's collective time out; when rank 0 dies the others' waits raise and they exit. Startup waits
for each rank's handshake through a pipe (its error text if loading failed), watching exit codes.

Several machines (``nnodes > 1``): node 0 hosts the store on ``dist_init_addr`` and runs ranks
``0 .. tp_size/nnodes - 1``; node ``k`` runs :func:`run_node`, which starts its own ranks, joins
the store, and reports their handshake there (``node<k>/joining``, ``node<k>/loaded``, or
``node<k>/error`` with the reason), where rank 0 waits for it. gloo then connects each rank
through the address its machine reaches node 0 from.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixserve.config import EngineConfig
from radixserve.models.parallel import TPGroup
from radixserve.runtime.tp_batch import stop_header

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # a rank's start (interpreter, torch) and, separately, its model load
STOP_TIMEOUT_S = 5.0
_CONTROL_WAIT = datetime.timedelta(days=365)  # the other ranks wait for batches while rank 0 idles
JOINING, LOADED = "joining", "loaded"  # the handshake messages of a rank through its pipe
# a rank's process: (config, rank, the store's (host, port), its end of the handshake pipe, its
# parent's pid)
RankEntry = Callable[[EngineConfig, int, tuple[str, int], Connection, int], None]


class TPStartupError(RuntimeError):
    """A tensor-parallel rank failed to start or to load its slice of the model."""


@dataclasses.dataclass(frozen=True, slots=True)
class RankGroups:
    """One rank's backends: the model's group and the gloo control backend."""

    group: TPGroup
    control: Any
    store: Any  # kept alive as long as the backends (rank 0 hosts it)


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """The config of ``rank``: its own GPU of its machine on CUDA, the rest unchanged."""
    if torch.device(config.device).type == "cuda":
        return dataclasses.replace(config, device=f"cuda:{rank % _per_node(config)}")
    return config


def _per_node(config: EngineConfig) -> int:
    return config.parallel.tp_size // config.parallel.nnodes


def store_address(config: EngineConfig) -> tuple[str, int]:
    """Where the ranks meet: ``dist_init_addr`` across machines, else loopback (port 0: any)."""
    if config.parallel.nnodes == 1:
        return "127.0.0.1", 0
    host, _, port = (config.parallel.dist_init_addr or "").rpartition(":")
    return host.strip("[]"), int(port)


def gloo_hostname(config: EngineConfig) -> str:
    """The address gloo listens on: the one this machine reaches node 0 from."""
    if config.parallel.nnodes == 1:
        return "127.0.0.1"
    host = store_address(config)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), 9))  # (no packet is sent)
        return str(probe.getsockname()[0])


def make_groups(config: EngineConfig, rank: int, store: Any) -> RankGroups:
    """Join the backends of the group (blocks until every rank has joined)."""
    size, timeout = (
        config.parallel.tp_size,
        datetime.timedelta(seconds=config.parallel.tp_timeout_s),
    )
    control_opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    control_opts._timeout = _CONTROL_WAIT
    hostname = gloo_hostname(config)
    control_opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
    control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size, control_opts)
    model_store = dist.PrefixStore("model", store)
    device = torch.device(rank_config(config, rank).device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        backend: Any = dist.ProcessGroupNCCL(model_store, rank, size, nccl_opts)
    else:
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
        backend = dist.ProcessGroupGloo(model_store, rank, size, opts)
    return RankGroups(TPGroup(rank, size, backend, timeout), control, store)


class TensorParallelRanks:
    """Start with :meth:`start`; rank 0 loads its own slice, then calls :meth:`wait_loaded`."""

    def __init__(
        self,
        config: EngineConfig,
        groups: RankGroups,
        procs: list[BaseProcess],
        pipes: list[Connection],
    ):
        self.config = config
        self.groups = groups
        self.procs = procs
        self.pipes = pipes
        self._stopped = False

    @property
    def group(self) -> TPGroup:
        return self.groups.group

    @property
    def control(self) -> Any:
        return self.groups.control

    @classmethod
    def start(cls, config: EngineConfig, entry: RankEntry) -> TensorParallelRanks:
        """Spawn ranks ``1 .. tp_size - 1``, each running ``entry`` (``run_tp_worker``: the
        caller hands it in, since that process imports this module), and join the groups."""
        size = config.parallel.tp_size
        host, port = store_address(config)
        store = dist.TCPStore(
            host,
            port,
            size,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
        )
        procs: list[BaseProcess] = []
        pipes: list[Connection] = []
        try:
            _spawn(config, entry, range(1, _per_node(config)), (host, store.port), procs, pipes)
            _wait_all(procs, pipes, JOINING)
            _wait_nodes(store, config, JOINING)
            groups = make_groups(config, 0, store)
        except BaseException:
            _stop(procs)
            raise
        logger.info("tensor parallel: %d ranks joined (pids %s)", size, [p.pid for p in procs])
        return cls(config, groups, procs, pipes)

    def wait_loaded(self) -> None:
        """Until every other rank has loaded its slice; ``TPStartupError`` with its reason."""
        try:
            _wait_all(self.procs, self.pipes, LOADED)
            _wait_nodes(self.groups.store, self.config, LOADED)
        except BaseException:
            self.shutdown()
            raise

    def check_alive(self) -> None:
        """``RuntimeError`` naming the first rank that has exited."""
        for rank, proc in enumerate(self.procs, start=1):
            if proc.exitcode is not None:
                raise RuntimeError(
                    f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code "
                    f"{proc.exitcode}; the model cannot run without it"
                )

    def shutdown(self) -> None:
        """Tell the other ranks to stop (if they can still hear it), then reap them."""
        if self._stopped:
            return
        self._stopped = True
        if all(p.exitcode is None for p in self.procs):
            try:
                timeout = datetime.timedelta(seconds=STOP_TIMEOUT_S)
                self.control.broadcast(stop_header(), 0, timeout).wait()
            except Exception as exc:
                logger.warning("could not tell the tensor-parallel ranks to stop: %s", exc)
        _stop(self.procs)


def _spawn(
    config: EngineConfig,
    entry: RankEntry,
    ranks: range,
    store: tuple[str, int],
    procs: list[BaseProcess],
    pipes: list[Connection],
) -> None:
    """Start ``entry`` for each of ``ranks`` (spawn), appending to ``procs`` and ``pipes``."""
    ctx = mp.get_context("spawn")
    for rank in ranks:
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=entry,
            args=(config, rank, store, writer, os.getpid()),
            name=f"radixserve-tp{rank}",
            daemon=True,
        )
        proc.start()
        writer.close()
        procs.append(proc)
        pipes.append(reader)


def _wait_nodes(store: Any, config: EngineConfig, expected: str) -> None:
    """Until every other machine has reported ``expected`` through the store (its error text
    raises ``TPStartupError``)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    for node in range(1, config.parallel.nnodes):
        while not store.check([f"node{node}/{expected}"]):
            if store.check([f"node{node}/error"]):
                error = store.get(f"node{node}/error").decode()
                raise TPStartupError(f"tensor-parallel node {node} failed:\n{error}")
            if time.monotonic() > deadline:
                raise TPStartupError(f"tensor-parallel node {node} was not {expected} in time")
            time.sleep(0.1)


def run_node(config: EngineConfig, entry: RankEntry) -> int:
    """Node ``node_rank`` > 0: start this machine's ranks, report their handshake to node 0
    through the store, then wait. The exit code: 0 when node 0 stopped them, else 1."""
    host, port = store_address(config)
    first = config.parallel.node_rank * _per_node(config)
    logger.info(
        "tensor-parallel node %d: ranks %d-%d, joining %s:%d",
        config.parallel.node_rank,
        first,
        first + _per_node(config) - 1,
        host,
        port,
    )
    store = dist.TCPStore(
        host,
        port,
        config.parallel.tp_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
    )
    procs: list[BaseProcess] = []
    pipes: list[Connection] = []
    prefix = f"node{config.parallel.node_rank}"
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: _stop(procs))
    try:
        _spawn(config, entry, range(first, first + _per_node(config)), (host, port), procs, pipes)
        _wait_all(procs, pipes, JOINING, first)
        store.set(f"{prefix}/{JOINING}", "ok")
        _wait_all(procs, pipes, LOADED, first)
        store.set(f"{prefix}/{LOADED}", "ok")
        while all(p.exitcode is None for p in procs):
            time.sleep(0.5)
    except Exception:
        store.set(f"{prefix}/error", traceback.format_exc())
        logger.exception("tensor-parallel node %d failed", config.parallel.node_rank)
    finally:
        _stop(procs)
        signal.signal(signal.SIGTERM, old_term)
    return 0 if procs and all(p.exitcode == 0 for p in procs) else 1


def _wait_all(
    procs: list[BaseProcess], pipes: list[Connection], expected: str, first: int = 1
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    for rank, (proc, pipe) in enumerate(zip(procs, pipes, strict=True), start=first):
        while True:
            if pipe.poll(0.1):
                try:
                    msg = pipe.recv()
                except EOFError:
                    msg = None
                if msg == expected:
                    break
                if isinstance(msg, str):
                    raise TPStartupError(f"tensor-parallel rank {rank} failed:\n{msg}")
            if proc.exitcode is not None:
                raise TPStartupError(
                    f"tensor-parallel rank {rank} exited with code {proc.exitcode} while starting"
                )
            if time.monotonic() > deadline:
                raise TPStartupError(f"tensor-parallel rank {rank} was not {expected} in time")


def _stop(procs: list[BaseProcess]) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0.1))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
