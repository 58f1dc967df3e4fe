"""Scheduler overhead: time per ``step()`` spent outside the model forward, at a given batch.

Runs a decode-heavy workload on a tiny random model (where the forward is cheap, so overhead
shows) and splits each step into forward + sampling (the model worker) and everything else.

    python benchmarks/scheduler_overhead.py --batch 32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from radixserve.config import EngineConfig
from radixserve.models.tiny import train_tokenizer, write_tiny_model
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.scheduler import Scheduler
from radixserve.types import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of the scheduler side"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
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
        for overlap in (False, True):
            config = EngineConfig(
                model_path=tmp,
                dtype="float32",
                max_total_tokens=65536,
                max_running_requests=args.batch,
                disable_overlap_schedule=not overlap,
            )
            scheduler = Scheduler(config)
            worker_time: list[float] = []
            run = scheduler.worker._run

            def timed(batch, info, run=run, worker_time=worker_time):  # type: ignore[no-untyped-def]
                start = time.perf_counter()
                out = run(batch, info)
                worker_time.append(time.perf_counter() - start)
                return out

            scheduler.worker._run = timed  # type: ignore[method-assign]
            for i in range(args.batch):
                params = SamplingParams(
                    max_new_tokens=args.steps + 10, temperature=0.0, ignore_eos=True
                )
                scheduler.add_request(
                    GenerateRequest(
                        f"r{i}", [(i * 7 + j) % 500 + 5 for j in range(args.prompt_len)], params
                    )
                )
            while len(scheduler.running) < args.batch:  # prefill everything first
                scheduler.step()
            worker_time.clear()
            step_time = []
            profiler = None
            if args.profile and not overlap:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            for _ in range(args.steps):
                start = time.perf_counter()
                scheduler.step()
                step_time.append(time.perf_counter() - start)
            if profiler is not None:
                profiler.disable()
            scheduler.shutdown()
            step_ms = statistics.median(step_time) * 1e3
            fwd_ms = statistics.median(worker_time) * 1e3
            name = "overlap" if overlap else "normal"
            print(
                f"{name:>8}: step {step_ms:6.2f} ms   forward+sample {fwd_ms:6.2f} ms   "
                f"outside the forward {step_ms - fwd_ms:6.2f} ms ({(step_ms - fwd_ms) / step_ms:.0%})"
                if not overlap
                else f"{name:>8}: step {step_ms:6.2f} ms   forward+sample {fwd_ms:6.2f} ms (in a worker thread, overlapped)"
            )
            if profiler is not None:
                import pstats

                pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
