"""The process of a tensor-parallel rank other than 0: its slice of the model, nothing else.

No scheduler, radix tree or allocator here: rank 0 decides everything and broadcasts each
step's batch (``tp_batch.py``); this rank writes the ``req_to_token`` rows it is sent into its
own table, runs the same forward over its own KV pool (its KV heads, the same number of slots
as rank 0's) and takes part in the collectives. The logits it gathers are dropped: rank 0
samples.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from types import FrameType

import torch.distributed as dist

from radixserve.config import EngineConfig
from radixserve.models.numerics import cpu_kernels_for
from radixserve.runtime.kv_layout import KVLayout
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.tp_batch import BatchReceiver, Reload, stage_on_every_rank
from radixserve.runtime.tp_ranks import (
    JOINING,
    LOADED,
    STARTUP_TIMEOUT_S,
    make_groups,
    rank_config,
)

logger = logging.getLogger(__name__)
_LOG_FORMAT = "%(asctime)s %(levelname)s [%(processName)s] %(name)s: %(message)s"


def run_tp_worker(
    config: EngineConfig, rank: int, store: tuple[str, int], ready: Connection, parent_pid: int
) -> None:
    """Process entry point: join the groups, load this rank's slice, then run every batch rank
    0 sends until it says stop (exit 0) or is gone (exit 1)."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    # Ctrl-C reaches rank 0, which stops this rank; SIGTERM (from rank 0) exits cleanly
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # tqdm (the weight-loading bar) would make a multiprocessing lock whose semaphore _exit()
    # cannot release
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    config = rank_config(config, rank)
    ready.send(JOINING)
    client = dist.TCPStore(
        store[0],
        store[1],
        config.parallel.tp_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
    )
    groups = make_groups(config, rank, client)
    try:
        kernels = cpu_kernels_for(config)
        layout = KVLayout.from_config(config, kernels)
        kv_cache, rows = layout.build_pools(config)
        runner = ModelRunner(config, kv_cache, rows, kernels, tp=groups.group)
    except Exception:
        ready.send(traceback.format_exc())
        _exit(1)
    ready.send(LOADED)
    ready.close()
    receiver = BatchReceiver(groups.control, rows, runner.device)
    code = 0
    try:
        while (item := receiver.recv()) is not None:
            if isinstance(item, Reload):
                _reload(runner, groups.control, item.model_path)
            else:
                runner.forward(item)
    except SystemExit:
        pass
    except BaseException as exc:
        gone = os.getppid() != parent_pid
        why = "its parent is gone" if gone else f"{type(exc).__name__}: {exc}"
        logger.error("tensor-parallel rank %d stops: %s", rank, why)
        code = 1
    _exit(code)


def _reload(runner: ModelRunner, control: object, model_path: str) -> None:
    """Stage the checkpoint rank 0 named; put it in the model once every rank has (rank 0
    reports a failure; this rank logs its own)."""
    try:
        staged = stage_on_every_rank(runner.model, model_path, control)
    except Exception as exc:
        logger.error("the weights in %s were not loaded: %s", model_path, exc)
        return
    staged.commit()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _exit(code: int) -> None:
    """Leave now: the interpreter's teardown with torch and gloo loaded takes seconds."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
