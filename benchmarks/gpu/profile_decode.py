"""Where a decode step's time goes on the device (``device_gpu.sh``'s profile stage).

For each batch size: the wall time of a greedy decode step through ModelRunner (the 0.5B-shaped
random model, bf16), the host time of the attention metadata (FlashInfer's ``plan``) inside it,
the device's kernel time per step (torch profiler), and so the share of the step the device
sits idle waiting for the host; then the profiler's top host and device ops, and the device's
time per step by kind of kernel (GEMM, attention, norm, index, other: ``by_kind``). ``--configs``
compares ways of stepping in one run: ``+eager`` (no CUDA graphs), ``+fullplan`` (FlashInfer's
full ``plan`` at each replay instead of the fast one), ``+fullplan+devindptr`` (also the
indptrs built on the device, so each plan copies them back to the host). Written to
``--out`` and printed. On ``--device cpu`` the same measurements (no device column).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from radixserve.models.attention import flashinfer_backend
from radixserve.models.attention.flashinfer_backend import PagedKVMetadata
from radixserve.models.forward_batch import ForwardBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from model_throughput import SHAPE_WRITERS, OurSide, ensure_shaped_model, synchronize  # noqa: E402


def timed_metadata(side: OurSide) -> list[float]:
    """Wrap the runner's attention metadata builds (eager and graph); returns the list their
    host times go to."""
    backend = side.runner.attn_backend
    spent: list[float] = []
    for name in ("init_forward_metadata", "init_graph_metadata"):
        inner = getattr(backend, name, None)
        if inner is not None:
            setattr(backend, name, _timed(inner, spent))
    return spent


def _timed(inner: Callable[[ForwardBatch], None], spent: list[float]) -> Callable:
    def call(batch: ForwardBatch) -> None:
        start = time.perf_counter()
        inner(batch)
        spent.append(time.perf_counter() - start)

    return call


def kernel_seconds(prof: profile) -> float:
    """The device's busy time: the sum of the kernels' own durations."""
    events = prof.key_averages()
    return sum(getattr(e, "self_device_time_total", 0.0) for e in events) / 1e6


# a kernel's kind by its name (cuBLAS's nvjet/cutlass/sm90 GEMMs and their split-K reduction,
# FlashInfer's attention and merge, torch's norms, index kernels, the rest): first match wins
KINDS = (
    ("attention", ("flashinfer::Batch", "flashinfer::Single")),
    ("attention merge", ("MergeStates", "merge_state")),
    ("GEMM", ("nvjet", "gemm", "gemv", "cutlass", "splitKreduce", "sm90_xmma", "ampere")),
    ("norm", ("layer_norm", "rms", "RMSNorm", "Norm")),
    ("index (KV writes, gathers)", ("index",)),
)


def by_kind(kernels: list[tuple[str, float]]) -> dict[str, float]:
    """Device seconds per kind (``KINDS``; "other": pointwise kernels, copies) of (kernel
    name, seconds) pairs, largest first."""
    out: dict[str, float] = {}
    for name, seconds in kernels:
        kind = next((k for k, keys in KINDS if any(s in name for s in keys)), "other")
        out[kind] = out.get(kind, 0.0) + seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def device_kernels(prof: profile) -> list[tuple[str, float]]:
    """(name, device seconds) of each kernel the profile saw: the events with device time and
    no host time of their own (torch's ops carry both, their kernels the device's alone)."""
    return [
        (e.key, e.self_device_time_total / 1e6)
        for e in prof.key_averages()
        if getattr(e, "self_device_time_total", 0) > 0 and e.self_cpu_time_total == 0
    ]


def device_indptrs(inner: Callable[..., PagedKVMetadata]) -> Callable[..., PagedKVMetadata]:
    """``build_paged_kv_metadata`` with the indptrs and last page lengths moved to the device, so
    each FlashInfer ``plan`` copies them back to the host (a sync per plan). Only with
    ``+fullplan``: the fast plan takes the host indptr as it is."""

    def build(*args: object, **kwargs: object) -> PagedKVMetadata:
        md = inner(*args, **kwargs)
        device = md.kv_indices.device
        return dataclasses.replace(
            md,
            qo_indptr=md.qo_indptr.to(device),
            kv_indptr=md.kv_indptr.to(device),
            kv_last_page_len=md.kv_last_page_len.to(device),
        )

    return build


def run(args: argparse.Namespace, config: str, bs: int, lines: list[str]) -> None:
    """One row; ``config`` is model_throughput.py's, and ``+devindptr`` (with ``+fullplan``)
    the indptrs built on the device (``device_indptrs``)."""
    options = config.split("+")
    if "devindptr" in options:
        if "fullplan" not in options:
            raise ValueError(f"{config!r}: +devindptr needs +fullplan")
        inner = flashinfer_backend.build_paged_kv_metadata
        flashinfer_backend.build_paged_kv_metadata = device_indptrs(inner)  # type: ignore[assignment]
        try:
            _run(args, "+".join(o for o in options if o != "devindptr"), bs, lines, config)
        finally:
            flashinfer_backend.build_paged_kv_metadata = inner  # type: ignore[assignment]
        return
    _run(args, config, bs, lines, config)


def _run(args: argparse.Namespace, config: str, bs: int, lines: list[str], name: str) -> None:
    side = OurSide(args.model_dir, config, bs, args.ctx + args.steps * 3 + 8, False, args.device)
    spent = timed_metadata(side)
    gen = torch.Generator().manual_seed(bs)
    prompts = torch.randint(0, side.runner.vocab_size, (bs, args.ctx), generator=gen)
    tokens, lens = side.prefill(prompts), [args.ctx] * bs

    def steps(n: int) -> None:
        nonlocal tokens, lens
        for _ in range(n):
            tokens = side.decode(tokens, lens)
            lens = [x + 1 for x in lens]

    steps(3)  # warm-up
    synchronize()
    spent.clear()
    start = time.perf_counter()
    steps(args.steps)
    synchronize()
    wall = (time.perf_counter() - start) / args.steps
    meta = sum(spent) / max(len(spent), 1)
    activities = [ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        steps(args.steps)
        synchronize()
    busy = kernel_seconds(prof) / args.steps
    idle = f", device busy {busy * 1e3:.3f} ms ({1 - busy / wall:.0%} idle)" if busy else ""
    lines.append(
        f"{name} b={bs}: {wall * 1e3:.3f} ms a step, attention metadata {meta * 1e3:.3f} ms on the host"
        f"{idle}"
    )
    print(lines[-1], flush=True)
    averages = prof.key_averages()
    lines.append(
        averages.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60)
    )
    if busy:
        kinds = by_kind(device_kernels(prof))
        lines.append(
            "device ms a step by kind: "
            + ", ".join(f"{k} {s / args.steps * 1e3:.3f}" for k, s in kinds.items())
        )
        lines.append(
            averages.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60)
        )
    print("\n".join(lines[-3 if busy else -1 :]), flush=True)  # now: a later batch may fail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-dir", type=Path, default=Path("bench_out/qwen25_05b_shaped"))
    parser.add_argument("--model-shape", choices=list(SHAPE_WRITERS), default="qwen25-0.5b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument(
        "--configs", nargs="+", default=["bfloat16"], help="model_throughput.py's, e.g. +eager"
    )
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    ensure_shaped_model(args.model_dir, args.model_shape, args.device)
    lines: list[str] = []
    for config in args.configs:
        for bs in args.batches:
            run(args, config, bs, lines)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
