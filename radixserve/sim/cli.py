"""``radixserve sim run|calibrate|export``. Importing this module is cheap (argparse only)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from radixserve.config import SCHEDULE_POLICIES, AdmissionConfig

DEFAULT_POLICY = AdmissionConfig().schedule_policy

DEFAULT_COST = "qwen25-05b-cpu"  # the 0.5B-shaped model on a 2-core AVX2 CPU (docs/sim.md)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N1,N2,..., got {text!r}") from None


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        return int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI, got {text!r}") from None


def _add_trace_flags(p: argparse.ArgumentParser) -> None:
    from radixserve.sim.shapes import TRACES

    add = p.add_argument
    add("--trace", default="shared-prefix", choices=TRACES, help="gsp: SGLang's defaults")
    add("--trace-file", default=None, help="the JSONL file of --trace jsonl")
    for flag in ("groups", "prompts-per-group", "system-len", "question-len", "output-len"):
        add(f"--{flag}", type=int, default=None, help="shared-prefix / gsp")
    add("--request-rate", type=float, default=float("inf"), help="Poisson req/s (shared-prefix)")
    add("--max-concurrency", type=int, default=None, help="clients (default: the shape's)")
    add("--conversations", type=int, default=None, help="multiturn")
    add("--turns", type=int, default=None, help="multiturn")
    add("--seed", type=int, default=0)
    add("--token-range", type=_range, default=(3, 32000), help="LO-HI token ids of prompts")
    add("--loras", type=int, default=None, help="K: session i under LoRA adapter i %% K")


def add_sim_parser(sub: Any) -> argparse.ArgumentParser:
    sim = sub.add_parser("sim", help="simulate a trace through the real scheduler (no model)")
    cmds = sim.add_subparsers(dest="sim_command", required=True)
    run = cmds.add_parser("run", help="replay a trace on a virtual clock; print the table")
    _add_trace_flags(run)
    add = run.add_argument
    add("--cost", default=DEFAULT_COST, help="a cost model JSON, a built-in name, or 'h100'")
    add("--kv-tokens", type=int, default=65536, help="KV pool of each replica, in tokens")
    add("--policy", default=DEFAULT_POLICY, choices=SCHEDULE_POLICIES, help="the server's default")
    add("--max-running", type=int, default=64)
    add("--max-loras-per-batch", type=int, default=8, help="distinct LoRA adapters per batch")
    add("--chunked-prefill-size", type=int, default=512)
    add("--disable-prefill-interleaving", action="store_true", help="see radixserve serve")
    add("--max-prefill-tokens", type=int, default=16384)
    add("--page-size", type=int, default=1)
    add(
        "--no-aging",
        action="store_true",
        help="turn off the cache-aware policies' anti-starvation aging",
    )
    add("--disable-radix-cache", action="store_true")
    add("--dp-size", type=_ints, default=[1], help="replicas: N or N1,N2,... (a sweep)")
    add("--router", default="cache_aware", help="comma list of router policies (dp-size > 1)")
    add(
        "--sweep",
        default=None,
        help="e.g. kv_tokens=4096,65536,policy=fcfs,lpm,aging=on,off,passes",
    )
    add("--check-integrity-every", type=int, default=0, help="check the KV every N steps")
    add("--out", default="sim_out", help="directory for the JSON (and the PNG of a sweep)")
    add("--name", default=None)
    cal = cmds.add_parser("calibrate", help="fit a cost model on the real runtime")
    add = cal.add_argument
    add("--model", required=True, help="checkpoint directory")
    add("--dtype", default="bfloat16", choices=("auto", "bfloat16", "float32", "float16"))
    add("--threads", type=int, default=1, help="torch threads (1: steadiest on a shared host)")
    add("--repeat", type=int, default=2, help="runs per point; the fastest counts")
    add("--out", default="cost_model.json")
    exp = cmds.add_parser("export", help="write a one-turn trace as JSONL")
    _add_trace_flags(exp)
    exp.add_argument("--out", required=True)
    return sim


def run(args: argparse.Namespace) -> int:
    try:
        if args.sim_command == "calibrate":
            return _calibrate(args)
        if args.sim_command == "export":
            return _export(args)
        return _run(args)
    except ValueError as exc:
        print(f"radixserve sim: {exc}", file=sys.stderr)
        return 2


def _trace(args: argparse.Namespace) -> Any:
    from radixserve.sim.shapes import TraceSpec, build_trace

    spec = TraceSpec(
        kind=args.trace,
        path=args.trace_file,
        groups=args.groups,
        prompts_per_group=args.prompts_per_group,
        system_len=args.system_len,
        question_len=args.question_len,
        output_len=args.output_len,
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        conversations=args.conversations,
        turns=args.turns,
        seed=args.seed,
        token_range=args.token_range,
        loras=args.loras,
    )
    return build_trace(spec)


def _export(args: argparse.Namespace) -> int:
    from radixserve.sim.trace import write_jsonl

    sessions, _, text = _trace(args)
    with open(args.out, "w", encoding="utf-8") as f:
        n = write_jsonl(sessions, f)
    print(f"wrote {n} requests ({text}) to {args.out}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from radixserve.config import EngineConfig
    from radixserve.sim.calibrate import calibrate

    config = EngineConfig.from_flat(
        model_path=args.model, dtype=args.dtype, num_threads=args.threads
    )
    cost = calibrate(config, args.repeat, progress=print)
    cost.save(args.out)
    print(cost.to_json(), end="")
    print(f"wrote {args.out}")
    return 0


def load_cost(name: str) -> Any:
    from radixserve.sim.cost_model import H100_SXM, QWEN25_05B, CostModel, from_roofline

    if name == "h100":
        return from_roofline(QWEN25_05B, H100_SXM)
    return CostModel.load(name)


def _run(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    from pathlib import Path

    import torch

    from radixserve.config import EngineConfig
    from radixserve.sim import sweep
    from radixserve.sim.simulation import SimOptions, Simulation
    from radixserve.sim.summary import sim_table, summarize

    torch.set_num_threads(1)  # tiny tensor ops only: threads cost more than they give
    cost = load_cost(args.cost)
    sessions, parallel, text = _trace(args)
    base = EngineConfig.from_flat(
        max_total_tokens=args.kv_tokens,
        schedule_policy=args.policy,
        max_running_requests=args.max_running,
        max_loras_per_batch=args.max_loras_per_batch,
        chunked_prefill_size=args.chunked_prefill_size,
        enable_prefill_interleaving=not args.disable_prefill_interleaving,
        max_prefill_tokens=args.max_prefill_tokens,
        page_size=args.page_size,
        disable_radix_cache=args.disable_radix_cache,
        disable_overlap_schedule=True,
    )
    if args.no_aging:
        base = base.replace(constants=base.admission.constants.without_aging())
    routers = args.router.split(",")
    sweep.check_routers(routers)
    grid = sweep.parse_sweep(args.sweep)
    grid.setdefault("dp_size", [str(d) for d in args.dp_size])
    grid.setdefault("router", routers if any(int(d) > 1 for d in grid["dp_size"]) else routers[:1])
    runs = []
    for point in sweep.points(grid):
        dp = int(point["dp_size"])
        config = sweep.apply(base, point)
        opts = SimOptions(
            config,
            cost,
            dp_size=dp,
            router_policy=point["router"],
            parallel=parallel,
            token_range=args.token_range,
            seed=args.seed,
            check_integrity_every=args.check_integrity_every,
        )
        result = Simulation(opts, sessions).run()
        label = (
            ",".join(f"{k}={v}" for k, v in point.items() if len(grid[k]) > 1 or k == "policy")
            or f"{config.admission.schedule_policy}"
        )
        runs.append(summarize(label, result, {"point": point}))
        print(f"  {label}: {result.num_steps} steps", file=sys.stderr)
    print(f"trace: {args.trace}, {text}; cost model: {args.cost}")
    print(sim_table(runs))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"sim-{args.trace}"
    (out / f"{name}.json").write_text(
        json.dumps({"trace": text, "cost": dataclasses.asdict(cost), "runs": runs}, indent=1)
    )
    if len(runs) > 1:
        sweep.write_plot(runs, f"radixserve sim: {args.trace}, {text}", out / f"{name}.png")
        print(f"wrote {out / name}.json and .png")
    return 0
