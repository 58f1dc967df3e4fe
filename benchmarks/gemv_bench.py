"""Weight bandwidth of decode-shaped linear layers, route by route, side by side.

    .venv/bin/python benchmarks/gemv_bench.py [--rounds 7] [--ms 1,4,8,16,32] [--no-compile]

Shapes (Qwen2.5-0.5B): 48 cache-cold 4864x896 bf16 weights (418 MB, one pass = 48 products) and
the 151936x896 tied lm_head (272 MB); then one full batch-1 decode pass over all 24 layers'
weights (q/k/v with bias, o, gate, up, down) plus the lm_head (988 MB). GB/s = weight bytes read
per second (x and y are negligible). Every round runs every route once, so host noise hits all
routes alike; the table shows the median over rounds and, in brackets, the best.

Routes: F.linear (oneDNN); torch.compile of (w * x).sum(-1) (inductor reduction, compiled once per
M); radixserve's linear() (``CpuKernels.linear``: the skinny GEMM of this CPU's kernel variant
for M <= MAX_M, else torch); the kernel forced at every M (shows where it stops paying off); fp32
weights through F.linear and the kernel. ``RADIXSERVE_CPU_ISA=avx2`` benchmarks a lower variant;
``--variants avx512 avx512_bf16`` adds each named variant's kernel (forced at every M) as a route
of its own, so variants are compared in one process, interleaved (those this CPU cannot run are
left out).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from radixserve.config import EngineConfig
from radixserve.models.kernels import MAX_M, CpuKernels, _ext, quantize_int8, torch_linear
from radixserve.models.kernels.cpu_kernels import MIN_TASK_BYTES

Route = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
HIDDEN, INTER, VOCAB, LAYERS = 896, 4864, 151936, 24


def compiled_mul_sum() -> Route:
    """torch.compile of the broadcast multiply-reduce (inductor's generated reduction)."""

    @torch.compile(dynamic=False)
    def mul_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (w.unsqueeze(0) * x.unsqueeze(1)).sum(-1, dtype=torch.float32).to(x.dtype)

    def route(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        y = mul_sum(x, w)
        return y if b is None else y + b

    return route


KERNELS = CpuKernels.build(EngineConfig().execution.cpu_isa)


def forced_kernel(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    assert KERNELS.module is not None
    y: torch.Tensor = KERNELS.module.try_linear(x, w, None, b, 1 << 30, MIN_TASK_BYTES)
    return y


def variant_kernel(name: str) -> Route | None:
    """The kernel of variant ``name`` at every M, or None where this CPU cannot run it."""
    module = _ext.load_variant(name)
    if module is None:
        return None

    def route(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        y: torch.Tensor = module.try_linear(x, w, None, b, 1 << 30, MIN_TASK_BYTES)
        return y

    return route


def time_rounds(
    routes: dict[str, Route], work: Callable[[Route], None], rounds: int
) -> dict[str, list[float]]:
    """Seconds per pass of ``work`` for each route, routes interleaved within every round."""
    times: dict[str, list[float]] = {name: [] for name in routes}
    for route in routes.values():
        work(route)  # warm-up (compiles, first-touch of outputs)
    for _ in range(rounds):
        for name, route in routes.items():
            start = time.perf_counter()
            work(route)
            times[name].append(time.perf_counter() - start)
    return times


def fmt(nbytes: int, secs: list[float]) -> str:
    med, best = statistics.median(secs), min(secs)
    return f"{nbytes / med / 1e9:5.1f} ({nbytes / best / 1e9:4.1f})"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for r in [header, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def bench_shapes(args: argparse.Namespace, routes: dict[str, Route]) -> None:
    gen = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    mlp = [(torch.randn(INTER, HIDDEN, generator=gen) * 0.02).to(bf) for _ in range(48)]
    lm_head = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).to(bf)
    mlp32 = [w.float() for w in mlp[:24]] if args.fp32 else []
    for label, weights in (("48 x 4864x896 bf16", mlp), ("lm_head 151936x896 bf16", [lm_head])):
        nbytes = sum(w.numel() * w.element_size() for w in weights)
        rows = []
        for m in args.ms:
            x = torch.randn(m, HIDDEN, generator=gen).to(bf)
            active = {
                k: r for k, r in routes.items() if not (k == "compiled" and len(weights) == 1)
            }

            def work(route: Route, x: torch.Tensor = x, weights: list = weights) -> None:
                for w in weights:
                    route(x, w, None)

            times = time_rounds(active, work, args.rounds)
            rows.append([f"M={m}"] + [fmt(nbytes, times[k]) if k in times else "-" for k in routes])
        print_table(f"{label}: GB/s median (best)", ["", *routes], rows)
    if mlp32:
        nbytes = sum(w.numel() * 4 for w in mlp32)
        rows = []
        for m in args.ms:
            x = torch.randn(m, HIDDEN, generator=gen)
            fp32_routes: dict[str, Route] = {"F.linear": F.linear, "kernel": forced_kernel}

            def work32(route: Route, x: torch.Tensor = x) -> None:
                for w in mlp32:
                    route(x, w, None)

            times = time_rounds(fp32_routes, work32, args.rounds)
            rows.append([f"M={m}"] + [fmt(nbytes, times[k]) for k in fp32_routes])
        print_table(
            "24 x 4864x896 fp32 (bytes of fp32): GB/s median (best)",
            ["", "F.linear", "kernel"],
            rows,
        )


def bench_int8(args: argparse.Namespace) -> None:
    """96 cache-cold 4864x896 int8 weights (418 MB, like the bf16 table's 48): the skinny kernel
    of each variant (x quantized to Q8, int8 dot products), on an AMX CPU the AMX GEMM (x
    quantized per row, int8 tiles) at every M, and radixserve's routed ``linear()``, against
    torch (the weight widened per call, then F.linear: fp32 where bf16 GEMMs are emulated, bf16
    on AMX / AVX512-BF16 CPUs) and against F.linear on the same weights stored in bf16 (twice the
    bytes: shown as the int8 GB/s of the same work)."""
    gen = torch.Generator().manual_seed(2)
    weights = [quantize_int8(torch.randn(INTER, HIDDEN, generator=gen) * 0.02) for _ in range(96)]
    bf16 = {id(q): (q.float() * s[:, None]).to(torch.bfloat16) for q, s in weights}
    nbytes = sum(q.numel() for q, _ in weights)
    fp32 = KERNELS.gemm_in_fp32
    routes: dict[str, Route] = {
        "torch": lambda x, q, s: torch_linear(x, q, None, s, fp32_compute=fp32),
        "bf16 F.linear": lambda x, q, s: F.linear(x, bf16[id(q)]),
        "linear()": lambda x, q, s: KERNELS.linear(x, q, None, s),
    }
    for name in dict.fromkeys([KERNELS.variant or "", *args.variants]):
        module = _ext.load_variant(name) if name else None
        if module is not None:
            routes[f"kernel[{name}]"] = partial(_int8_kernel, module)
    amx = _ext.load_variant("amx") if _ext.can_execute("amx") else None
    if amx is not None:
        routes["amx GEMM"] = lambda x, q, s: amx.try_linear(x, q, s, None, 0, MIN_TASK_BYTES, True)
    rows = []
    for m in args.ms:
        x = torch.randn(m, HIDDEN, generator=gen).to(torch.bfloat16)

        def work(route: Route, x: torch.Tensor = x) -> None:
            for q, s in weights:
                route(x, q, s)

        times = time_rounds(routes, work, args.rounds)
        rows.append([f"M={m}"] + [fmt(nbytes, times[k]) for k in routes])
    print_table("96 x 4864x896 int8: GB/s of int8 weight, median (best)", ["", *routes], rows)


def _int8_kernel(module: Any, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    y: torch.Tensor = module.try_linear(x, q, s, None, 1 << 30, MIN_TASK_BYTES)
    return y


def bench_decode_pass(args: argparse.Namespace) -> None:
    """All weights of one Qwen2.5-0.5B batch-1 decode step (988 MB), per route."""
    gen = torch.Generator().manual_seed(1)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    kv = 2 * 64
    layers = [
        [
            (rnd(HIDDEN, HIDDEN), rnd(HIDDEN), False),  # q
            (rnd(kv, HIDDEN), rnd(kv), False),  # k
            (rnd(kv, HIDDEN), rnd(kv), False),  # v
            (rnd(HIDDEN, HIDDEN), None, False),  # o
            (rnd(INTER, HIDDEN), None, False),  # gate
            (rnd(INTER, HIDDEN), None, False),  # up
            (rnd(HIDDEN, INTER), None, True),  # down (input: intermediate)
        ]
        for _ in range(LAYERS)
    ]
    lm_head = rnd(VOCAB, HIDDEN)
    nbytes = lm_head.numel() * 2 + sum(w.numel() * 2 for layer in layers for w, _, _ in layer)
    routes: dict[str, Route] = {"F.linear": F.linear, "linear()": KERNELS.linear}
    rows = []
    for m in (1, 4, 8):
        x, xi = rnd(m, HIDDEN) * 50, rnd(m, INTER) * 50

        def work(route: Route, x: torch.Tensor = x, xi: torch.Tensor = xi) -> None:
            for layer in layers:
                for w, b, wide in layer:
                    route(xi if wide else x, w, b)
            route(x, lm_head, None)

        times = time_rounds(routes, work, args.rounds)
        row = [f"M={m}"]
        for k in routes:
            med = statistics.median(times[k])
            row.append(f"{med * 1e3:6.1f} ms {fmt(nbytes, times[k])} GB/s")
        rows.append(row)
    print_table(
        f"full decode pass, {nbytes / 1e6:.0f} MB of weights (ms/step, GB/s median (best))",
        ["", *routes],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--ms", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 8, 16, 32]
    )
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--no-fp32", dest="fp32", action="store_false")
    parser.add_argument("--no-decode", dest="decode", action="store_false")
    parser.add_argument("--int8", action="store_true", help="add the int8-weight table")
    parser.add_argument(
        "--variants", nargs="*", default=[], choices=_ext.VARIANT_NAMES, help="extra routes"
    )
    args = parser.parse_args()
    ok = KERNELS.dense
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{torch.backends.cpu.get_cpu_capability()}; kernel variant: {KERNELS.variant} "
        f"(MAX_M={MAX_M})"
    )
    routes: dict[str, Route] = {"F.linear": F.linear}
    if args.compile:
        routes["compiled"] = compiled_mul_sum()
    if ok:
        routes["linear()"] = KERNELS.linear
        routes["kernel(any M)"] = forced_kernel
    for name in args.variants:
        route = variant_kernel(name)
        if route is not None:
            routes[f"kernel[{name}]"] = route
    with torch.inference_mode():
        bench_shapes(args, routes)
        if args.int8:
            bench_int8(args)
        if args.decode:
            bench_decode_pass(args)


if __name__ == "__main__":
    main()
