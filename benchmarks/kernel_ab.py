"""Decode steps (and prefills) with this tree's CPU kernels against another tree's, in one process.

    git worktree add /tmp/before <rev>
    .venv/bin/python benchmarks/kernel_ab.py --model-dir <model> --before /tmp/before \
        [--configs bfloat16 bfloat16+int8] [--batch-sizes 1 8] [--ctx 512] [--rounds 9] \
        [--prefill-lens 128 512]

Both trees' kernel extensions are built (each tree's own ``_ext.py`` names its build after its
sources), one model is loaded, and every round times ``--steps`` decode steps (or one prefill
of each ``--prefill-lens`` tokens) with each extension in turn (the order alternating), swapping
the extension under the model's ``CpuKernels``. The variant is the one the engine would take
(``RADIXSERVE_CPU_ISA`` forces a lower one, as for the server). On a shared host whose memory bandwidth moves by 2x between minutes, separate
processes before and after cannot tell a 10% change from the host's phase; rounds side by side
in one process can. Prints the median tok/s of each side and the median of the per-round ratios.
``--before`` this very tree gives an A/A run: the ratios' spread is the host's noise. Both
trees' bindings must take the same arguments (a change of a binding's signature is measured
with a probe of its own).
``--int8-max-m LO HI`` instead runs this tree's extension on both sides with the most rows the
skinny GEMM keeps for int8 weights at ``LO`` ("before") and ``HI`` ("after"): how a routing
constant such as ``VNNI_INT8_MAX_M`` is measured (batch sizes between the two, at least one
route each side).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from model_throughput import OurSide

from radixserve.config import EngineConfig
from radixserve.models.attention.cpu_kernel import CpuKernelBackend
from radixserve.models.kernels import CpuKernels, _ext


def other_tree_extension(tree: Path, variant: str) -> ModuleType:
    """The kernel extension of ``variant`` built from ``tree``'s sources."""
    path = tree / "radixserve/models/kernels/_ext.py"
    spec = importlib.util.spec_from_file_location("kernel_ab_before_ext", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"no kernel sources at {path}")
    ext = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ext  # dataclasses look their module up while it executes
    spec.loader.exec_module(ext)
    module = ext.load_variant(variant)
    if module is None:
        raise ValueError(f"{tree} does not build the {variant} kernels here")
    return module


def use(**fields: object) -> None:
    """Every live ``CpuKernels`` with an extension now has ``fields`` (they are frozen): its
    ``module``, or a routing field such as ``int8_max_m``. Attention backends holding a kernel
    of a swapped ``module`` (``CpuKernelBackend.kernel``, taken once at their start) take the new
    module's."""
    objects = gc.get_objects()
    for obj in objects:
        if type(obj) is CpuKernels and obj.module is not None:  # no proxy objects asked
            for name, value in fields.items():
                object.__setattr__(obj, name, value)
    for obj in objects:
        if type(obj) is CpuKernelBackend and obj.kernels.module is not None:
            kernel = obj.kernels.attention_kernel(obj.kv_cache.dtype, obj.spec.head_dim)
            assert kernel is not None, "the backend's kernels took it at its start"
            obj.kernel = kernel


def side_by_side(
    sides: dict[str, dict[str, object]], rounds: int, run: Callable[[], int]
) -> dict[str, list[float]]:
    """tokens/s of ``run`` (returns its token count) with each side's ``CpuKernels`` fields
    (``use``), per round."""
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides.items())
        for name, fields in order if r % 2 == 0 else order[::-1]:
            use(**fields)
            start = time.perf_counter()
            tokens = run()
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def report(label: str, rates: dict[str, list[float]]) -> None:
    ratios = [a / b for a, b in zip(rates["after"], rates["before"], strict=True)]
    print(
        f"{label:24s} tok/s before {statistics.median(rates['before']):6.1f}"
        f" after {statistics.median(rates['after']):6.1f}; after / before, median of"
        f" rounds {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    other = parser.add_mutually_exclusive_group(required=True)
    other.add_argument("--before", type=Path, help="the other tree")
    other.add_argument(
        "--int8-max-m",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="this tree on both sides, the skinny GEMM's int8 rows at most LO / HI",
    )
    parser.add_argument("--configs", nargs="+", default=["bfloat16", "bfloat16+int8"])
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1])
    parser.add_argument("--prefill-lens", type=int, nargs="*", default=[])
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variant = _ext.best_variant(EngineConfig().execution.cpu_isa)
    if variant is None:
        raise SystemExit("no CPU kernel variant builds here")
    after = _ext.load_variant(variant)
    if after is None:
        raise SystemExit(f"this tree does not build the {variant} kernels here")
    sides: dict[str, dict[str, object]]
    if args.int8_max_m:
        lo, hi = args.int8_max_m
        sides = {"before": {"int8_max_m": lo}, "after": {"int8_max_m": hi}}
        print(
            f"kernel variant {variant}, {args.threads} threads, int8_max_m before {lo}, after {hi}"
        )
    else:
        before = other_tree_extension(args.before, variant)
        sides = {"before": {"module": before}, "after": {"module": after}}
        same = after.__name__ == before.__name__  # one build: an A/A run
        aa = " (the same extension: an A/A run, the noise floor)" if same else ""
        print(f"kernel variant {variant}, {args.threads} threads, before = {args.before}{aa}")
    for config in args.configs:
        for n in args.prefill_lens:
            side = OurSide(args.model_dir, config, 1, n + 8, False)
            prompt = torch.randint(100, 1000, (1, n))

            def prefill(side: OurSide = side, prompt: torch.Tensor = prompt, n: int = n) -> int:
                side.prefill(prompt)
                return n

            report(f"{config} prefill {n}", side_by_side(sides, args.rounds, prefill))
            del side
            gc.collect()
        for bs in args.batch_sizes:
            side = OurSide(args.model_dir, config, bs, args.ctx + 8, False)
            tokens = side.prefill(torch.randint(100, 1000, (bs, args.ctx)))

            def decode(side: OurSide = side, bs: int = bs) -> int:
                nonlocal tokens
                for s in range(args.steps):  # the same few slots, rewritten
                    tokens = side.decode(tokens, [args.ctx + s % 4] * bs)
                return bs * args.steps

            report(f"{config} b={bs}", side_by_side(sides, args.rounds, decode))
            del side
            gc.collect()


if __name__ == "__main__":
    main()
