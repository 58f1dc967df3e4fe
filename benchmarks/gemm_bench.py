"""Prefill-shaped linear layers, route by route, side by side: GFLOP/s.

    .venv/bin/python benchmarks/gemm_bench.py [--rounds 5] [--ms 16 32 64 128 512] [--int8]

Shapes (Qwen2.5-0.5B, x [M, K] @ w [N, K].T): the fused qkv 1152x896, o 896x896, the fused
gate/up 9728x896 and down 896x4864, at each M; the last row sums them with the weights of one
layer (FLOPs of a whole prefill of M tokens / 24 layers). Routes:

- ``torch fp32``: F.linear on fp32 weights and fp32 x (what HF transformers runs in float32);
- ``torch route``: what ``torch_linear`` runs for bf16 (int8) weights on a CPU without native
  bf16: the weight widened to fp32 per call, then the same GEMM;
- ``skinny``: gemv.cpp's skinny GEMM forced at every M;
- ``packed``: gemm.cpp's packed GEMM forced at every M;
- ``linear()``: ``CpuKernels.linear``, the route radixserve takes (skinny up to its row limit,
  then the packed GEMM where the variant uses it, else torch).

x is bf16 except for ``torch fp32``. Every round runs every route once (host noise hits all
alike); the table shows the median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixserve.config import EngineConfig
from radixserve.models.kernels import CpuKernels, quantize_int8, torch_linear

SHAPES = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}


def routes(k: CpuKernels) -> dict[str, Callable[[torch.Tensor, dict], torch.Tensor]]:
    """Each route as f(x_bf16, weights) with weights = {"fp32", "stored", "scale"}."""
    mod = k.module
    assert mod is not None, "no kernel variant on this CPU"

    def forced(x: torch.Tensor, w: dict, gemm: bool) -> torch.Tensor:
        max_m = 0 if gemm else 1 << 30
        y: torch.Tensor = mod.try_linear(x, w["stored"], w["scale"], None, max_m, 1, gemm)
        return y

    return {
        "torch fp32": lambda x, w: F.linear(w["x32"], w["fp32"]),
        "torch route": lambda x, w: torch_linear(x, w["stored"], None, w["scale"], True),
        "skinny": lambda x, w: forced(x, w, False),
        "packed": lambda x, w: forced(x, w, True),
        "linear()": lambda x, w: k.linear(x, w["stored"], None, w["scale"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ms", type=int, nargs="+", default=[16, 32, 64, 128, 512])
    parser.add_argument("--int8", action="store_true", help="int8 weights instead of bf16")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    k = CpuKernels.build(EngineConfig().execution.cpu_isa)
    print(f"variant {k.variant}, {args.threads} threads, weights {'int8' if args.int8 else 'bf16'}")
    print(f"packed GEMM in linear(): {k.gemm} (skinny up to {k.bf16_max_m} / {k.int8_max_m} rows)")
    table = routes(k)
    gen = torch.Generator().manual_seed(0)
    # per shape: "stored" (bf16 or int8), "scale" (None for bf16), "fp32" (the weight, widened)
    weights: dict[str, dict[str, torch.Tensor | None]] = {}
    for name, (n, kk) in SHAPES.items():
        w = torch.randn(n, kk, generator=gen) * 0.05
        if args.int8:
            q, s = quantize_int8(w)
            weights[name] = {"stored": q, "scale": s, "fp32": q.float() * s[:, None]}
        else:
            weights[name] = {"stored": w.bfloat16(), "scale": None, "fp32": w.bfloat16().float()}
    print(f"{'M':>5} {'shape':>8} " + " ".join(f"{r:>12}" for r in table))
    for m in args.ms:
        totals = dict.fromkeys(table, 0.0)
        flops_total = 0.0
        for name, (n, kk) in SHAPES.items():
            ws = dict(weights[name])
            x = torch.randn(m, kk, generator=gen).bfloat16()
            ws["x32"] = x.float()
            times: dict[str, list[float]] = {r: [] for r in table}
            for _ in range(args.rounds + 1):  # the first round warms up
                for r, f in table.items():
                    start = time.perf_counter()
                    f(x, ws)
                    times[r].append(time.perf_counter() - start)
            flops = 2.0 * m * n * kk
            flops_total += flops
            med = {r: statistics.median(v[1:]) for r, v in times.items()}
            for r in table:
                totals[r] += med[r]
            print(f"{m:>5} {name:>8} " + " ".join(f"{flops / med[r] / 1e9:>12.1f}" for r in table))
        row = " ".join(f"{flops_total / totals[r] / 1e9:>12.1f}" for r in table)
        print(f"{m:>5} {'layer':>8} {row}")


if __name__ == "__main__":
    main()
