"""Tensor parallelism on this machine: tp=2 against tp=1, decode and prefill, side by side.

Through the Engine (so the per-step batch broadcast is counted) on the Qwen2.5-0.5B-shaped
random model, greedy, every prompt a fresh one (no radix hits). Both sides use the same cores
in all: tp=1 runs ``--threads`` torch threads, each tp=2 rank ``--threads / 2``. Then the
collectives alone, between two processes over gloo: one all-reduce of the hidden states
(``2 * layers + 1`` per step: attention, MLP, embedding) and the logits' all-gather, timed at
decode and prefill shapes, as the cost per step that tp adds. Example::

    python benchmarks/tp_throughput.py --prompt-len 256 --batch-sizes 1 8 --decode-steps 32
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from radixserve import Engine
from radixserve.config import EngineConfig
from radixserve.models.model_config import ModelConfig
from radixserve.runtime.tp_ranks import make_groups


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 2000), (n, length), generator=g).tolist()


def engine_figures(
    model: Path, tp: int, threads: int, args: argparse.Namespace
) -> dict[str, float]:
    out: dict[str, float] = {}
    config = dict(dtype=args.dtype, tp_size=tp, num_threads=threads, max_total_tokens=8192)
    with Engine(str(model), **config) as engine:
        vocab = engine.scheduler.worker.vocab_size
        seed = 0

        def run(n: int, length: int, new: int) -> float:
            nonlocal seed
            seed += 1
            params = {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}
            start = time.perf_counter()
            engine.generate(input_ids=_prompts(n, length, vocab, seed), sampling_params=params)
            return time.perf_counter() - start

        run(1, 16, 2)  # warm up
        prefill = statistics.median(run(1, args.prompt_len, 1) for _ in range(args.reps))
        out["prefill tok/s"] = args.prompt_len / prefill
        for bs in args.batch_sizes:
            short = statistics.median(run(bs, 32, 1) for _ in range(args.reps))
            full = statistics.median(run(bs, 32, 1 + args.decode_steps) for _ in range(args.reps))
            out[f"decode bs={bs} tok/s"] = bs * args.decode_steps / (full - short)
            out[f"decode bs={bs} ms/step"] = 1000 * (full - short) / args.decode_steps
    return out


def _collective_rank(rank: int, port: int, shapes: list[tuple[str, int, int, str]], q: Any) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(60))
    group = make_groups(EngineConfig.from_flat(tp_size=2), rank, store).group
    results = {}
    for name, rows, cols, kind in shapes:
        x = torch.randn(rows, cols)
        fn = group.all_reduce if kind == "reduce" else group.all_gather
        for _ in range(5):
            fn(x)
        times = []
        for _ in range(50):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
        results[name] = statistics.median(times)
    if rank == 0:
        q.put(results)


def collective_figures(
    cfg: ModelConfig, batch_sizes: list[int], prompt_len: int
) -> dict[str, float]:
    shapes = [
        (f"all-reduce [{b}, {cfg.hidden_size}]", b, cfg.hidden_size, "reduce") for b in batch_sizes
    ]
    shapes.append(
        (f"all-reduce [{prompt_len}, {cfg.hidden_size}]", prompt_len, cfg.hidden_size, "reduce")
    )
    shapes += [
        (f"all-gather [{b}, {cfg.vocab_size // 2}]", b, cfg.vocab_size // 2, "gather")
        for b in batch_sizes
    ]
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_collective_rank, args=(r, store.port, shapes, q)) for r in range(2)
    ]
    for p in procs:
        p.start()
    results = q.get(timeout=300)
    for p in procs:
        p.join(30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path("bench_out/qwen25_05b_shaped"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if not (args.model_dir / "config.json").is_file():
        from radixserve.models.tiny import write_qwen25_05b_shaped

        print(f"writing the Qwen2.5-0.5B-shaped random model to {args.model_dir} ...")
        write_qwen25_05b_shaped(args.model_dir)
    cfg = ModelConfig.from_dir(args.model_dir)
    one = engine_figures(args.model_dir, 1, args.threads, args)
    two = engine_figures(args.model_dir, 2, max(1, args.threads // 2), args)
    print(f"\n{'':28s}{'tp=1':>12s}{'tp=2':>12s}{'tp2/tp1':>10s}")
    for key in one:
        print(f"{key:28s}{one[key]:12.1f}{two[key]:12.1f}{two[key] / one[key]:10.2f}")
    per_step = 2 * cfg.num_layers + 1
    print(
        f"\ncollectives between 2 gloo processes (median of 50; {per_step} all-reduces and one "
        "all-gather per step):"
    )
    for name, seconds in collective_figures(cfg, args.batch_sizes, args.prompt_len).items():
        factor = 1 if "gather" in name else per_step
        print(
            f"  {name:32s}{seconds * 1e6:9.0f} us  x{factor:<3d} = {seconds * factor * 1e3:7.2f} ms/step"
        )


if __name__ == "__main__":
    main()
