"""``radixserve bench multiturn|shared-prefix`` (also ``python -m radixserve.bench ...``).

Importing this module is cheap (argparse only): the ``radixserve`` command builds its parser
with :func:`add_bench_parser` and calls :func:`run` for ``bench``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from radixserve.bench.models import BENCH_MODELS
from radixserve.bench.workload import MULTITURN_SHAPES, SHARED_PREFIX_SHAPES
from radixserve.units import parse_size

POLICY_SWEEP = ("fcfs", "lpm", "dfs-weight", "hrrn", "adaptive")


def _range(text: str) -> tuple[int, int]:
    """``64`` or ``256-512`` (inclusive)."""
    lo, _, hi = text.partition("-")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI, got {text!r}") from None


def _add_common(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--quick", action="store_true", help="a tiny random model and a small trace (< 1 min)")
    add(
        "--model",
        default=None,
        help="checkpoint dir or hub id, or a bench model made on first use with random weights: "
        f"{', '.join(BENCH_MODELS)} (default: qwen25-05b; --quick: tiny)",
    )
    add(
        "--prompts",
        default="text",
        choices=("text", "random"),
        help="text: windows of real text through the model's tokenizer; random: uniform ids",
    )
    add("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    add("--device", default="cpu", help="of every system: cpu, cuda or cuda:N")
    add(
        "--quantization",
        default=None,
        choices=("int8",),
        help="weight-only quantization of the radixserve systems (serve --quantization); the "
        "HF baselines have none, so pick --baselines none or no-cache",
    )
    add(
        "--backend",
        default="engine",
        choices=("engine", "http", "frontend"),
        help="engine: in-process Engine; http: raw /generate on a server it starts (or --url); "
        "frontend: frontend programs over RuntimeEndpoint",
    )
    add("--url", default=None, help="a running radixserve server for the cached run")
    add(
        "--policy",
        default="fcfs",
        help=f"a schedule policy, a comma list, or 'sweep' ({','.join(POLICY_SWEEP)})",
    )
    add(
        "--baselines",
        default=None,
        help="comma list of no-cache, hf, hf-kv, or 'none' (default: all three for multiturn; "
        "no-cache,hf for shared-prefix, where carrying KV within a request changes nothing)",
    )
    add("--compare-url", default=None, help="another OpenAI-compatible server (/v1/completions)")
    add("--compare-model", default=None, help="its model name (default: its first /v1/models)")
    add("--hf-batch-size", type=int, default=None, help="HF batch (default: the parallelism)")
    add("--threads", type=int, default=None, help="torch threads of every system")
    add(
        "--repeat",
        type=int,
        default=1,
        help="runs of the trace per system, back to back; the fastest is reported (a shared "
        "host only ever adds time; an --compare-url server runs once)",
    )
    add(
        "--dp-size",
        type=int,
        default=1,
        help="> 1: radixserve serve --dp-size N behind sglang-router, one system per "
        "--router-policy (needs --backend http)",
    )
    add(
        "--router-policy",
        default="cache_aware,round_robin",
        help="comma list of router policies compared with --dp-size; POLICY:grpc runs smg over "
        "gRPC workers, whose cache_aware follows the workers' KV events",
    )
    add(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --dp-size: an extra sglang-router flag, e.g. "
        "--router-arg=--balance-abs-threshold=1 (repeatable)",
    )
    add(
        "--max-total-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the KV pool of the radixserve systems, in tokens (a pool smaller than the trace "
        "evicts; adds the 'unbounded' baseline, radixserve with its default pool)",
    )
    add(
        "--kv-tier",
        default=None,
        choices=("file", "host"),
        help="also run radixserve+tier: the same pool with a KV tier under its tree (a file "
        "tier in a temp dir, or host memory; docs/kv_tier.md)",
    )
    add(
        "--kv-tier-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="the tier's size, e.g. 2GB or 512MiB (default: the runtime's, twice the pool)",
    )
    add(
        "--speculative-algorithm",
        default=None,
        choices=("NGRAM",),
        help="the radixserve systems draft (serve's flag; docs/speculative.md); the report "
        "adds each one's accept length",
    )
    add(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens a request computes in one verify (serve's flag; default: serve's)",
    )
    add(
        "--enable-mixed-chunk",
        action="store_true",
        help="prefill steps also compute the running requests' next tokens (serve's flag)",
    )
    add("--seed", type=int, default=0)
    add("--out", default="bench_out", help="directory for the JSON and PNG")
    add("--name", default=None, help="file stem of the outputs (default: benchmark and shape)")


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``bench`` (with its sub-commands) to the ``radixserve`` sub-parsers ``sub``."""
    bench = sub.add_parser("bench", help="benchmarks: multi-turn chat, shared prefixes")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    mt = kinds.add_parser("multiturn", help="C conversations x T turns, P parallel clients")
    _add_common(mt)
    add = mt.add_argument
    add("--shape", default="a", choices=("a", "b"), help="default shape (flags override)")
    add("--conversations", type=int, default=None)
    add("--turns", type=int, default=None)
    add("--user-len", type=_range, default=None, help="N or LO-HI tokens")
    add("--answer-len", type=_range, default=None, help="N or LO-HI tokens (ignore_eos)")
    add("--parallel", type=int, default=None, help="parallel clients")
    add("--system-len", type=int, default=0, help="a system prompt shared by all")
    sp = kinds.add_parser("shared-prefix", help="groups of prompts sharing a system prompt")
    _add_common(sp)
    add = sp.add_argument
    add("--groups", type=int, default=None)
    add("--prompts-per-group", type=int, default=None)
    add("--system-len", type=int, default=None)
    add("--question-len", type=int, default=None)
    add("--output-len", type=int, default=None)
    add("--request-rate", type=float, default=float("inf"), help="Poisson req/s (inf: at once)")
    add("--max-concurrency", type=int, default=64, help="most requests in flight")
    return bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def _pick(args: argparse.Namespace, preset: dict[str, Any], key: str) -> Any:
    value = getattr(args, key)
    return preset[key] if value is None else value


def run(args: argparse.Namespace) -> int:
    """Runs ``radixserve bench ...`` from its parsed arguments; the exit code (2: bad input)."""
    try:
        return _run(args)
    except ValueError as exc:
        print(f"radixserve bench: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from radixserve.bench.benchmark import run_benchmark
    from radixserve.bench.models import ensure_bench_model, text_corpus, token_range
    from radixserve.bench.systems import BenchOptions
    from radixserve.bench.workload import MultiTurnSpec, SharedPrefixSpec
    from radixserve.hub import resolve_model

    kind = args.model or ("tiny" if args.quick else "qwen25-05b")
    model = str(ensure_bench_model(kind)) if kind in BENCH_MODELS else resolve_model(kind)
    spec: MultiTurnSpec | SharedPrefixSpec
    if args.bench_command == "multiturn":
        shape = "quick" if args.quick else args.shape
        p = MULTITURN_SHAPES[shape]
        spec = MultiTurnSpec(
            num_conversations=_pick(args, p, "conversations"),
            num_turns=_pick(args, p, "turns"),
            user_len=_pick(args, p, "user_len"),
            answer_len=_pick(args, p, "answer_len"),
            parallel=_pick(args, p, "parallel"),
            system_len=args.system_len,
            seed=args.seed,
        )
        parallel = spec.parallel
    else:
        shape = "quick" if args.quick else "default"
        p = SHARED_PREFIX_SHAPES[shape]
        spec = SharedPrefixSpec(
            num_groups=_pick(args, p, "groups"),
            prompts_per_group=_pick(args, p, "prompts_per_group"),
            system_len=_pick(args, p, "system_len"),
            question_len=_pick(args, p, "question_len"),
            output_len=_pick(args, p, "output_len"),
            request_rate=args.request_rate,
            max_concurrency=args.max_concurrency,
            seed=args.seed,
        )
        parallel = spec.max_concurrency
    policies = POLICY_SWEEP if args.policy == "sweep" else tuple(args.policy.split(","))
    default_baselines = "no-cache,hf,hf-kv" if args.bench_command == "multiturn" else "no-cache,hf"
    if args.max_total_tokens is not None:
        default_baselines = f"unbounded,{default_baselines}"
    chosen = args.baselines or default_baselines
    baselines = () if chosen == "none" else tuple(chosen.split(","))
    opts = BenchOptions(
        model_path=model,
        dtype=args.dtype,
        device=args.device,
        quantization=args.quantization,
        backend=args.backend,
        url=args.url,
        policies=policies,
        baselines=baselines,
        compare_url=args.compare_url,
        compare_model=args.compare_model,
        parallel=parallel,
        hf_batch_size=args.hf_batch_size or min(parallel, 16),
        num_threads=args.threads,
        token_range=token_range(model),
        corpus=text_corpus(model) if args.prompts == "text" else None,
        repeat=args.repeat,
        dp_size=args.dp_size,
        router_policies=tuple(args.router_policy.split(",")),
        router_args=tuple(args.router_arg),
        max_total_tokens=args.max_total_tokens,
        kv_tier=args.kv_tier,
        kv_tier_bytes=args.kv_tier_size,
        speculative_algorithm=args.speculative_algorithm,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        enable_mixed_chunk=args.enable_mixed_chunk,
    )
    sweep = "-sweep" if len(policies) > 1 else (f"-dp{args.dp_size}" if args.dp_size > 1 else "")
    sweep += "-tier" if args.kv_tier else ""
    sweep += "-spec" if args.speculative_algorithm else ""
    name = args.name or f"{args.bench_command}-{shape}{sweep}"
    run_benchmark(spec, opts, Path(args.out), name)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(["bench", *(sys.argv[1:] if argv is None else argv)]))
