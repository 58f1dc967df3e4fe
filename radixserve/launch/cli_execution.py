"""``serve``'s flags of how the model runs: the overlap loop and CUDA graphs
(``ExecutionConfig``), and tensor parallelism over one or several machines (``ParallelConfig``).
The CPU kernel and thread knobs have no flag: their environment variables set them."""

from __future__ import annotations

import argparse

from radixserve.config import OVERLAP_LAUNCHES, ExecutionConfig, ParallelConfig
from radixserve.launch.cli_parts import part_from_args

_DEFAULTS = ExecutionConfig()


def add_execution_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--disable-overlap-schedule",
        action="store_true",
        help="do not prepare the next batch while the current one runs",
    )
    add(
        "--overlap-launch",
        choices=OVERLAP_LAUNCHES,
        default=_DEFAULTS.overlap_launch,
        help="with overlap: launch each batch from a worker thread, or from the scheduler thread "
        "on the device's stream (asynchronous on CUDA only)",
    )
    add(
        "--disable-cuda-graph",
        action="store_true",
        help="CUDA: run every decode step eagerly instead of replaying captured graphs",
    )
    add(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="CUDA: the largest decode batch replayed from a graph (default: "
        "--max-running-requests, at most 256)",
    )
    add(
        "--cuda-graph-verify",
        action="store_true",
        help="CUDA, with --speculative-algorithm: replay verify forwards from graphs too (up to "
        "64 requests; not yet measured on a GPU, so off by default)",
    )


def add_parallel_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add(
        "--tp-size",
        type=int,
        default=ParallelConfig().tp_size,
        help="tensor parallelism: split the model over this many processes (gloo on CPU, NCCL "
        "on CUDA: one GPU each); see docs/tensor_parallel.md",
    )
    add("--nnodes", type=int, default=1, help="machines the --tp-size ranks are spread over")
    add("--node-rank", type=int, default=0, help="this machine's index (0 serves)")
    add("--dist-init-addr", default=None, metavar="HOST:PORT", help="node 0's address, all nodes")
    add(
        "--dp-rank",
        type=int,
        default=ParallelConfig().dp_rank,
        help="this worker's place among data-parallel workers started by hand (its KV events "
        "carry it; --dp-peers); --dp-size sets it itself",
    )


def execution_part(args: argparse.Namespace) -> ExecutionConfig:
    return part_from_args(ExecutionConfig, args)


def parallel_part(args: argparse.Namespace) -> ParallelConfig:
    return part_from_args(ParallelConfig, args)
