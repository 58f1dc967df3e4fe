"""The skinny GEMM's register tiles side by side on a model's decode-step linears.

    .venv/bin/python benchmarks/gemv_tiles.py --model-dir <model> [--ms 2 4 8 16] \
        [--layers 6] [--rounds 7] [--threads 2] [--shared-x] [--packed] [--prefill M] \
        [--json tiles.json]

Builds ``gemv_tiles.cpp`` (gemv.h's own ``run<..., R, MT>``: the production loop, prefetch and
split over threads, at each tile shape) with the flags of the kernel variant the engine would
take (``RADIXSERVE_CPU_ISA`` forces a lower one) and runs it per M. The weights are the model's fused linears of one layer (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``), as bf16, ``--layers`` copies on huge pages so every pass is
cache-cold; the lm_head is left out. Every round runs every tile, so the host's phase hits them
alike; the table shows the median GB/s of weight per shape and over all.

The first tile is the one the kernel takes from M = 2 on where weight rows are a page or more
(gemv.h's ``dispatch``; bf16 pairs on AVX512-BF16: 4 x 6, two tiles of 4 rows at M = 8;
fp32-widened rows elsewhere: 4 x 6 with AVX-512, 3 x 4 with AVX2), and each M's line ends with
the best tile against it. At M = 1 the kernel takes one-row tiles (``1x8``, one row of x).
``--shared-x`` runs every tile a second time with every row of x at one address, so x stays in
L1 (``4x6/x-in-L1``): the difference is what re-reading x from L2 costs.

``--packed`` (AVX512-BF16 only) adds the other orientation in the same rounds: the same weights
packed 16 rows to a vector per pair of k (``P<blocks>x<rows of x>``: per pair, one vector of
each block and one broadcast pair of x per row feed the VDPBF16PS, so x is read once per 16 x
blocks weight rows instead of once per R), each checked against the production tile's output
first. ``--prefill M`` times those tiles as a prefill GEMM over the packed layout (M rows of x
packed per call, one copy of the weights, hot: a best case, the weights packed beforehand)
beside torch's bf16 GEMM (oneDNN) on the same shapes, in GFLOP/s. A probe of the kernel, not of
the model: a decode step also runs attention, norms and the lm_head (``model_throughput.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from radixserve.bench.models import model_label
from radixserve.config import EngineConfig, cache_dir
from radixserve.models.kernels import _ext

REPO = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_suffix(".cpp")
KERNELS = REPO / "radixserve" / "models" / "kernels"
STAND_IN = REPO / "tests" / "models" / "kernel_check"  # ATen/Parallel.h without torch
PACKED_VARIANTS = ("avx512_bf16", "amx")  # the builds with VDPBF16PS (the packed tiles)


def layer_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """(N, K) of one decoder layer's fused linears, from the checkpoint's ``config.json``."""
    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    return {
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }


def build(out_dir: Path) -> tuple[Path, str]:
    """The probe built for this CPU's best kernel variant (and its name), cached by its sources
    and flags."""
    variant_name = _ext.best_variant(EngineConfig().execution.cpu_isa)  # RADIXSERVE_CPU_ISA
    if variant_name is None:
        raise SystemExit("no CPU kernel variant runs on this machine")
    variant = next(v for v in _ext.VARIANTS if v.name == variant_name)
    cmd = ["g++", "-std=c++20", "-O3", "-fopenmp", "-Wno-ignored-attributes", *variant.cflags]
    cmd += [f"-I{STAND_IN}", f"-I{KERNELS}", str(SOURCE)]
    h = hashlib.sha256("\0".join(cmd).encode())
    for src in (SOURCE, *sorted(KERNELS.glob("*.h")), *sorted(STAND_IN.rglob("*.h"))):
        h.update(src.read_bytes())
    exe = out_dir / f"gemv_tiles_{variant.name}_{h.hexdigest()[:12]}"
    if not exe.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([*cmd, "-o", str(exe)], check=True)
    return exe, variant.name


def torch_gflops(m: int, shapes: dict[str, tuple[int, int]], rounds: int) -> list[float]:
    """torch's bf16 GEMM (oneDNN) on each shape with m rows of x, hot; GFLOP/s per shape and
    over all (medians over rounds)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randn(m, k, generator=gen).bfloat16(), torch.randn(n, k, generator=gen).bfloat16())
        for n, k in shapes.values()
    ]
    secs: list[list[float]] = [[] for _ in pairs]
    for r in range(rounds + 1):  # round 0 untimed
        for i, (x, w) in enumerate(pairs):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            if r:
                secs[i].append(time.perf_counter() - t0)
    work = [2.0 * m * n * k for n, k in shapes.values()]
    med = [statistics.median(s) for s in secs]
    return [w / s / 1e9 for w, s in zip(work, med, strict=True)] + [sum(work) / sum(med) / 1e9]


def prefill_rows(exe: Path, args: argparse.Namespace, shapes, env) -> list[dict]:
    """The packed tiles as a prefill GEMM of ``args.prefill`` rows, then torch's, printed."""
    import torch

    torch.set_num_threads(args.threads)
    dims = [f"{n}:{k}" for n, k in shapes.values()]
    cmd = [str(exe), "prefill", str(args.prefill), str(args.rounds), *dims]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    rows = []
    for line in out.stdout.splitlines():
        _, tile, *values = line.split()
        rows.append({"m": args.prefill, "tile": tile, "gflop_s": [float(v) for v in values]})
    rows.append(
        {
            "m": args.prefill,
            "tile": "torch",
            "gflop_s": torch_gflops(args.prefill, shapes, args.rounds),
        }
    )
    print(f"prefill of {args.prefill} rows, hot weights; GFLOP/s")
    for r in rows:
        cells = [str(r["m"]), r["tile"], *(f"{v:.0f}" for v in r["gflop_s"])]
        print("  ".join(f"{c:>14}" for c in cells))
    for r in rows:
        r["gflop_s"] = dict(zip([*shapes, "all"], r["gflop_s"], strict=True))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--ms", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--layers", type=int, default=6, help="copies of the layer's weights")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shared-x", action="store_true", help="also each tile with x in L1")
    p.add_argument("--packed", action="store_true", help="also the weights packed by blocks")
    p.add_argument("--prefill", type=int, metavar="M", help="packed tiles and torch, M rows")
    p.add_argument("--build-dir", type=Path, default=Path(cache_dir()) / "probes")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    for name in ("ms", "layers", "rounds", "threads", "prefill"):
        values = getattr(args, name)
        if values is not None and min(values if isinstance(values, list) else [values]) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")

    shapes = layer_shapes(args.model_dir)
    exe, variant = build(args.build_dir)
    if (args.packed or args.prefill) and variant not in PACKED_VARIANTS:
        raise SystemExit(f"--packed and --prefill need AVX512-BF16 (variant {variant} here)")
    if (args.packed or args.prefill) and any(k % 2 for _, k in shapes.values()):
        raise SystemExit("--packed and --prefill need an even K in every shape")
    print(f"kernel variant {variant}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    dims = [f"{n}:{k}" for n, k in shapes.values()]
    mb = sum(2 * n * k for n, k in shapes.values()) * args.layers / 1e6
    print(
        f"{args.layers} layers x {mb / args.layers:.0f} MB of bf16 weight, {args.threads} threads,"
        f" {args.rounds} rounds{', and with x in L1' if args.shared_x else ''}; GB/s"
    )
    header = ["M", "tile", *(f"{k} {n}x{kk}" for k, (n, kk) in shapes.items()), "all"]
    print("  ".join(f"{h:>14}" for h in header))
    rows = []
    for m in args.ms:
        cmd = [str(exe), "decode", str(m), str(args.layers), str(args.rounds)]
        cmd += [str(int(args.shared_x)), str(int(args.packed))]
        out = subprocess.run([*cmd, *dims], env=env, check=True, capture_output=True, text=True)
        for line in out.stdout.splitlines():
            _, tile, *gbs = line.split()
            values = [float(v) for v in gbs]
            rows.append(
                {"m": m, "tile": tile, "gb_s": dict(zip([*shapes, "all"], values, strict=True))}
            )
            print("  ".join(f"{c:>14}" for c in [str(m), tile, *(f"{v:.1f}" for v in values)]))
        best = max(
            (r for r in rows if r["m"] == m and "/" not in r["tile"]),
            key=lambda r: r["gb_s"]["all"],
        )
        first = next(r for r in rows if r["m"] == m)
        ratio = best["gb_s"]["all"] / first["gb_s"]["all"]
        print(f"M={m}: best {best['tile']}, {ratio:.2f}x {first['tile']}")
    prefill = [] if args.prefill is None else prefill_rows(exe, args, shapes, env)
    if args.json:
        skip = ("model_dir", "build_dir", "json")  # no paths of this machine in the record
        record = {
            "benchmark": "gemv_tiles",
            "model": model_label(str(args.model_dir)),
            "kernel_variant": variant,
            "layer_shapes": {k: list(v) for k, v in shapes.items()},
            "options": {k: v for k, v in vars(args).items() if k not in skip},
            "rows": rows,
            "prefill_rows": prefill,
        }
        args.json.write_text(json.dumps(record, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
