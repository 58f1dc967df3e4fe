"""The scheduler's loop over the real model: overlap off, launched from the worker thread, or
from the scheduler thread on the device's stream, in one run (``device_gpu.sh``'s idle stage).

``scheduler_idle.py`` models the GPU; this runs the same loop (``SchedulerLoop.run_once``: the
zmq poll, ``Scheduler.step``, the outputs pushed to a socket a thread drains) over the real
``ModelRunner``, loaded once per shape and shared by every variant (its CUDA graphs too). For
each batch size B: B greedy requests of ``--context`` prompt tokens decode ``--warmup`` +
``--steps`` tokens each; the decode steps after the warm-up are timed. Each row prints the wall
time per step and the output tokens/s; the variants of a batch size run one after another, the
batch sizes interleave them, so drift hits all alike. ``--device cpu`` is the dry run (there a
forward runs where it is launched: ``stream`` serializes what ``thread`` overlaps).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from radixserve.config import EngineConfig
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.model_worker import ModelWorker
from radixserve.runtime.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from model_throughput import SHAPE_WRITERS, ensure_shaped_model  # noqa: E402
from scheduler_idle import add_decoders, drive  # noqa: E402

VARIANTS = {"off": (False, "thread"), "thread": (True, "thread"), "stream": (True, "stream")}


def decode_marks(scheduler: Scheduler) -> Callable[[], tuple[float, ...]]:
    """``drive``'s mark: the time, and the decode batches run so far."""
    stats = scheduler.stats
    return lambda: (time.perf_counter(), stats.num_decode_batches)


def step_ms(marks: list[tuple[float, ...]], warmup: int, steps: int) -> float:
    """The wall time per decode step between the ``warmup``-th and the ``warmup + steps``-th
    decode batch, from ``(time, decode batches so far)`` marks."""
    start = next(t for t, n in marks if n >= warmup)
    end = next(t for t, n in marks if n >= warmup + steps)
    return 1e3 * (end - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--model-shape", choices=list(SHAPE_WRITERS), default="qwen25-0.5b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ensure_shaped_model(args.model_dir, args.model_shape, args.device)
    max_bs = max(args.batches)
    ctx = args.context + args.warmup + args.steps + 8
    config = EngineConfig.from_flat(
        model_path=str(args.model_dir),
        dtype=args.dtype,
        device=args.device,
        max_running_requests=max_bs,
        max_total_tokens=max_bs * ctx + 8,
        max_context_len=ctx,
    )
    kv = KVManager.build(config)
    assert kv.kv_cache is not None
    runner = ModelRunner(config, kv.kv_cache, kv.req_to_token_pool)
    vocab = runner.vocab_size
    print(f"{'B':>4s} {'overlap':>8s} {'ms/step':>8s} {'tokens/s':>10s}", flush=True)
    rows = []
    for batch in args.batches:
        for name in args.variants:
            overlap, launch = VARIANTS[name]
            worker = ModelWorker(runner, max_bs, overlap, launch)
            scheduler = Scheduler(config, kv=kv, worker=worker)
            add_decoders(scheduler, batch, args.context, args.warmup + args.steps + 2, (5, vocab))
            marks = drive(scheduler, decode_marks(scheduler))
            ms = step_ms(marks, args.warmup, args.steps)
            rows.append(
                {"batch": batch, "overlap": name, "step_ms": ms, "tokens_per_s": batch / ms * 1e3}
            )
            print(f"{batch:4d} {name:>8s} {ms:8.2f} {batch / ms * 1e3:10.0f}", flush=True)
            scheduler.flush_cache()  # the next variant starts from an empty tree
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
