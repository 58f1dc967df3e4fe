"""Scheduler overhead: time per decode ``step()`` spent outside the model forward, at a batch.

Fills a batch of greedy ``ignore_eos`` requests, waits until each has its first token, then
times ``--steps`` decode steps. "Forward" is the model runner's forward plus sampling (timed by
wrapping ``ModelRunner.forward`` and ``Sampler.__call__``); "outside the forward" is the rest
of the step: scheduling, batch preparation, KV bookkeeping, output processing. Of the scheduler
the script uses only ``Scheduler(EngineConfig(...), tokenizer=...)``, ``add_request`` and
``step``, so it runs unchanged against older revisions.

``--compare-rev REV`` runs the same measurement on a detached ``git worktree`` of REV (in a temp
dir, removed afterwards) in a subprocess with ``PYTHONPATH`` there, alternating old and new
subprocesses ``--rounds`` times, and prints both with the ratio (the fastest round counts).

    python benchmarks/scheduler_overhead.py --batch 32
    python benchmarks/scheduler_overhead.py --batch 32 --compare-rev 4470cc1
    python benchmarks/scheduler_overhead.py --model-shape 0.5b --steps 20 --compare-rev 4470cc1
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from git_revision import REPO, describe, run_json, worktree

FIELDS = ("step_ms", "forward_ms", "outside_ms")


class ForwardTimer:
    """Wall time inside the model worker's compute: ``ModelRunner.forward`` (attention metadata,
    the model, the lm_head) and ``Sampler.__call__``, wrapped on their classes while ``patch()``
    is open. Both exist unchanged in every revision this compares; nothing of the scheduler's is
    touched. Calls may come from the overlap worker thread."""

    TARGETS = (
        ("radixserve.runtime.model_runner", "ModelRunner", "forward"),
        ("radixserve.runtime.sampler", "Sampler", "__call__"),
    )

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def patch(self) -> Iterator[None]:
        originals = []
        for module_name, class_name, method in self.TARGETS:
            cls = getattr(importlib.import_module(module_name), class_name)
            originals.append((cls, method, cls.__dict__[method]))
            setattr(cls, method, self._timed(cls.__dict__[method]))
        try:
            yield
        finally:
            for cls, method, original in originals:
                setattr(cls, method, original)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                with self._lock:
                    self.seconds.append(elapsed)

        return timed

    def take(self) -> float:
        with self._lock:
            total, self.seconds = sum(self.seconds), []
        return total


def import_generate_request() -> type:
    try:
        from radixserve.runtime.io_struct import GenerateRequest
    except ImportError:
        from radixserve.runtime.scheduler_io import GenerateRequest  # type: ignore[no-redef]
    return GenerateRequest


def measure(args: argparse.Namespace, overlap: bool) -> dict[str, float]:
    """Median step, forward and outside-the-forward times (ms) of the decode steps."""
    from radixserve.config import EngineConfig
    from radixserve.runtime.scheduler import Scheduler
    from radixserve.types import SamplingParams

    generate_request = import_generate_request()
    config = EngineConfig.from_flat(
        model_path=args.model_path,
        dtype=args.dtype,
        max_total_tokens=max(4096, args.batch * (args.prompt_len + args.steps + 256)),
        max_running_requests=args.batch,
        disable_overlap_schedule=not overlap,
    )
    scheduler = Scheduler(config, tokenizer=None)
    params = SamplingParams(max_new_tokens=args.steps + 200, temperature=0.0, ignore_eos=True)
    for i in range(args.batch):
        prompt = [(i * 7 + j) % 500 + 5 for j in range(args.prompt_len)]
        scheduler.add_request(generate_request(f"r{i}", prompt, params))
    started: set[str] = set()
    for _ in range(200):  # prefill everything: until every request has its first token
        started.update(out.rid for out in scheduler.step() or () if out.new_token_ids)
        if len(started) == args.batch:
            break
    else:
        raise RuntimeError(f"only {len(started)} of {args.batch} requests started")
    scheduler.step()
    timer = ForwardTimer()
    step_s, forward_s = [], []
    profiler = None
    if args.profile and not overlap:
        import cProfile

        profiler = cProfile.Profile()
    with timer.patch():
        if profiler is not None:
            profiler.enable()
        for _ in range(args.steps):
            start = time.perf_counter()
            scheduler.step()
            step_s.append(time.perf_counter() - start)
            forward_s.append(timer.take())
        if profiler is not None:
            profiler.disable()
    scheduler.shutdown()
    if profiler is not None:
        import pstats

        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    outside = [s - f for s, f in zip(step_s, forward_s, strict=True)]
    medians = (statistics.median(v) * 1e3 for v in (step_s, forward_s, outside))
    return dict(zip(FIELDS, medians, strict=True))


def worker(args: argparse.Namespace) -> None:
    import radixserve

    result = {"module": radixserve.__file__, "normal": measure(args, overlap=False)}
    if not args.no_overlap:
        result["overlap"] = measure(args, overlap=True)
    print(json.dumps(result))


@contextlib.contextmanager
def model_dir(args: argparse.Namespace) -> Iterator[str]:
    """A random checkpoint: the tiny 4-layer Llama, or Qwen2.5-0.5B's shape (bf16: the bench
    cache's copy, written on first use; fp32: a temp dir)."""
    from radixserve.models.tiny import train_tokenizer, write_qwen25_05b_shaped, write_tiny_model

    if args.model_shape == "0.5b" and args.dtype == "bfloat16":
        from radixserve.bench.models import ensure_bench_model

        yield str(ensure_bench_model("qwen25-05b"))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_shape == "0.5b":
            write_qwen25_05b_shaped(tmp, dtype=getattr(torch, args.dtype))
        else:
            write_tiny_model(
                tmp,
                "llama",
                num_layers=4,
                hidden_size=256,
                num_heads=4,
                num_kv_heads=2,
                intermediate_size=512,
                tokenizer=train_tokenizer(),
            )
        yield tmp


def run_worker(args: argparse.Namespace, path: str) -> dict:
    argv = [__file__, "--worker", "--model-path", args.model_path, "--dtype", args.dtype]
    argv += ["--batch", str(args.batch), "--steps", str(args.steps)]
    argv += ["--prompt-len", str(args.prompt_len), "--threads", str(args.threads)]
    return run_json(argv + (["--no-overlap"] if args.no_overlap else []), path)


def print_row(name: str, normal: dict[str, float], overlap: dict[str, float] | None) -> None:
    step, fwd, outside = (normal[f] for f in FIELDS)
    line = (
        f"{name:>8}: step {step:7.2f} ms   forward {fwd:7.2f} ms   "
        f"outside the forward {outside:6.2f} ms ({outside / step:5.1%})"
    )
    if overlap is not None:
        line += f"   overlap step {overlap['step_ms']:7.2f} ms"
    print(line)


def compare(args: argparse.Namespace) -> None:
    best: dict[str, dict] = {}
    print(f"before: {describe(args.compare_rev)}")
    print(f"after:  the working tree at {REPO}")
    with worktree(args.compare_rev) as old:
        for _ in range(args.rounds):  # alternate, so drifting load hits both alike
            for name, path in (("before", old), ("after", str(REPO))):
                result = run_worker(args, path)
                prev = best.get(name)
                if prev is None or result["normal"]["step_ms"] < prev["normal"]["step_ms"]:
                    best[name] = result
    for name in ("before", "after"):
        print_row(name, best[name]["normal"], best[name].get("overlap"))
    before, after = best["before"]["normal"], best["after"]["normal"]
    print(
        f"after / before: step {after['step_ms'] / before['step_ms']:.3f}x, "
        f"outside the forward {after['outside_ms'] / before['outside_ms']:.3f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--model-shape", choices=("tiny", "0.5b"), default="tiny")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default: fp32 tiny, bf16 0.5b"
    )
    parser.add_argument("--compare-rev", help="also measure this git revision, side by side")
    parser.add_argument("--rounds", type=int, default=3, help="alternations with --compare-rev")
    parser.add_argument("--no-overlap", action="store_true", help="skip the overlap-mode run")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of the scheduler side"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.model_shape == "0.5b" else "float32")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return
    with model_dir(args) as path:
        args.model_path = path
        if args.compare_rev:
            compare(args)
            return
        normal = measure(args, overlap=False)
        print_row("current", normal, None if args.no_overlap else measure(args, overlap=True))


if __name__ == "__main__":
    main()
