"""The schedule policies side by side on traces where the order matters.

Traces (one-turn requests, closed loop: ``--clients`` clients keep the queue under LPM's and
HRRN's 128-request FCFS fallback, so the cache-aware policies sort every pass):

- ``pressure``: ``--groups`` prefix groups of ``--prefix`` tokens each (popularity Zipf
  ``--zipf``), a working set well above the KV pool, so FCFS, taking the groups in arrival order,
  evicts a prefix before its next request comes and a cache-aware order saves prefill; plus
  cold one-off requests (``--cold-frac``, ``--cold-len`` tokens) and a few long prompts
  (``--long-frac``, ``--long-len``). Classes: hot, cold, long.
- ``starvation``: SGLang issue 31954's shape (``sim_starvation.py``): one hot group whose prefix
  the pool holds, and cold requests between; every order has the same hit rate.
- ``long``: short requests (``--short-len``) with long prompts of 8k-32k tokens among them (one
  in 50), chunked by 512, arriving open loop (Poisson, ``--long-rate`` per second, below
  saturation): what a short request waits behind a long prefill. Classes: short, long.

``--rate R`` (> 0; ``--real-rate`` for the real run) runs the same ``pressure`` requests open
loop instead, Poisson arrivals at R requests/s: every system is offered the same load, so its
TTFTs compare at equal load (in the closed loop a faster system is also sent more requests per
second, its cold ones included).

Systems (``--systems``, each ``POLICY[+age=N][+wage=F][+il]``): fcfs, lpm, dfs-weight and
adaptive with their default aging (by admissions, F = 2), hrrn; ``age=N``: aging by N passes
(``SchedulerConstants.max_skipped_passes``, default 0: off), ``wage=F``: by admissions
(``aging_work_factor``; ``lpm+age=0+wage=0`` is SGLang's LPM, ``+age=8+wage=0`` aging by
passes alone), and ``+il`` (``+ilmin=N``: keeping at least N tokens of a continuing
chunk, default half the chunk) with prefill interleaving (``policy/interleave.py``). Printed
per trace and system: the virtual wall time, prompt tokens/s, the hit rate, TTFT p99 of each
class, and each against FCFS (``x fcfs``). ``--real N`` also runs the first N requests of the
``pressure`` trace (``--real-trace starvation``: of that one) on the real Engine (the tiny
model, its cost model calibrated first) for ``--real-systems``, beside the simulator's replay
of the same N requests.

    python benchmarks/sim_policies.py --requests 100000          # the simulator only
    python benchmarks/sim_policies.py --requests 100000 --rate 5.19   # open loop
    python benchmarks/sim_policies.py --requests 2000 --real 1500 --traces pressure
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from radixserve.bench.records import percentiles
from radixserve.bench.report import format_table
from radixserve.bench.workload import Session, Turn
from radixserve.config import EngineConfig
from radixserve.sim.cost_model import CostModel
from radixserve.sim.simulation import SimOptions, SimRecord, Simulation
from radixserve.sim.trace import from_bench_sessions

SYSTEMS = (
    "fcfs",
    "lpm+age=0+wage=0",
    "lpm",
    "dfs-weight",
    "hrrn",
    "fcfs+il",
    "lpm+il",
    "hrrn+il",
)


def system_fields(system: str) -> dict[str, Any]:
    """``POLICY[+age=N][+wage=F][+il]``: the policy, the cache-aware policies' aging (by N
    passes, by admissions with factor F; 0: off; default ``SchedulerConstants``') and prefill
    interleaving (off without ``+il``, whatever the default)."""
    policy, *marks = system.split("+")
    fields: dict[str, Any] = {"schedule_policy": policy, "enable_prefill_interleaving": False}
    for mark in marks:
        if mark == "il":
            fields["enable_prefill_interleaving"] = True
        elif mark.startswith("age="):
            fields["max_skipped_passes"] = int(mark[4:])
        elif mark.startswith("wage="):
            fields["aging_work_factor"] = float(mark[5:])
        elif mark.startswith("ilmin="):  # interleaving's least continuation, in tokens
            fields["enable_prefill_interleaving"] = True
            fields["prefill_interleaving_min_continuation_tokens"] = int(mark[6:])
        else:
            raise ValueError(f"unknown system mark {mark!r} in {system!r}")
    return fields


Trace = tuple[list[Session], dict[int, str]]  # sessions, class of each sid


def pressure_trace(args: argparse.Namespace, n: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    low, high = args.token_range
    prefixes = rng.integers(low, high, (args.groups, args.prefix)).tolist()
    weights = 1.0 / np.arange(1, args.groups + 1) ** args.zipf
    weights /= weights.sum()
    kinds = rng.random(n)
    groups = rng.choice(args.groups, n, p=weights)
    sessions, classes = [], {}
    for sid in range(n):
        prefix: list[int]
        if kinds[sid] < args.long_frac:
            cls, prefix, user = "long", [], rng.integers(low, high, args.long_len).tolist()
        elif kinds[sid] < args.long_frac + args.cold_frac:
            cls, prefix, user = "cold", [], rng.integers(low, high, args.cold_len).tolist()
        else:
            cls, prefix = "hot", prefixes[groups[sid]]
            user = rng.integers(low, high, args.question).tolist()
        sessions.append(Session(sid, prefix, [Turn(user, args.output, [])]))
        classes[sid] = cls
    if args.rate > 0:  # the same requests, open loop: Poisson arrivals (their own generator)
        gaps = np.random.default_rng(seed + 1).exponential(1.0 / args.rate, n)
        times = np.cumsum(gaps) - gaps[0]
        sessions = [
            dataclasses.replace(s, arrival_s=float(t)) for s, t in zip(sessions, times, strict=True)
        ]
    return sessions, classes


def starvation_trace(args: argparse.Namespace, n: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    low, high = args.token_range
    prefix = rng.integers(low, high, 1024).tolist()
    sessions, classes = [], {}
    for sid in range(n):
        cold = sid % 51 == 50  # 2000 hot + 40 cold in sim_starvation.py's default
        user = rng.integers(low, high, 384 if cold else 32).tolist()
        sessions.append(Session(sid, [] if cold else prefix, [Turn(user, 16, [])]))
        classes[sid] = "cold" if cold else "hot"
    return sessions, classes


def long_trace(args: argparse.Namespace, n: int, seed: int = 0) -> Trace:
    """Open loop: Poisson arrivals at ``--long-rate`` requests/s, one in 50 a long prompt."""
    rng = np.random.default_rng(seed)
    low, high = args.token_range
    top = min(32768, args.long_kv_tokens - 1024)
    sessions, classes, t = [], {}, 0.0
    for sid in range(n):
        long = sid % 50 == 0
        size = int(rng.integers(8192, top + 1)) if long else args.short_len
        user = rng.integers(low, high, size).tolist()
        sessions.append(Session(sid, [], [Turn(user, 16, [])], t))
        classes[sid] = "long" if long else "short"
        t += float(rng.exponential(1.0 / args.long_rate))
    return sessions, classes


TRACES: dict[str, Callable[[argparse.Namespace, int], Trace]] = {
    "pressure": pressure_trace,
    "starvation": starvation_trace,
    "long": long_trace,
}


def engine_config(args: argparse.Namespace, system: str, **extra: Any) -> EngineConfig:
    fields = system_fields(system)
    consts = {k: fields.pop(k) for k in ("max_skipped_passes", "aging_work_factor") if k in fields}
    config = EngineConfig.from_flat(
        max_total_tokens=args.kv_tokens,
        max_running_requests=args.max_running,
        disable_overlap_schedule=True,
        **fields,
        **extra,
    )
    if consts:
        config = config.replace(constants=dataclasses.replace(config.admission.constants, **consts))
    return config


def row(name: str, records: list[Any], wall: float, classes: dict[int, str]) -> dict[str, Any]:
    """Wall time, prompt tokens/s, hit rate and TTFT p99 per class of one run."""
    ttft: dict[str, list[float]] = {}
    for r in records:
        if r.first_token_s is not None:
            ttft.setdefault(classes[r.sid], []).append(r.first_token_s - r.sent_s)
    prompt = sum(len(r.prompt_ids) for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    p99 = {c: (percentiles(v) or {}).get("p99", float("nan")) for c, v in ttft.items()}
    return {"name": name, "wall": wall, "tok_s": prompt / wall, "hit": cached / prompt, **p99}


def is_open_loop(sessions: list[Session]) -> bool:
    """Arrival times given (the ``long`` trace, ``--rate``): no client bound."""
    return any(s.arrival_s for s in sessions)


def simulate(args, system: str, trace: Trace, cost: CostModel) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    sessions, classes = trace
    open_loop = is_open_loop(sessions)
    parallel = None if open_loop else args.clients
    opts = SimOptions(engine_config(args, system), cost, parallel=parallel)
    result = Simulation(opts, from_bench_sessions(sessions)).run()
    records: list[SimRecord] = result.records
    return row(system, records, result.wall_s, classes)


def print_table(title: str, rows: list[dict[str, Any]], classes: list[str]) -> None:
    base = rows[0]
    header = ["system", "wall s", "prompt tok/s", "x fcfs", "hit"]
    header += [h for c in classes for h in (f"{c} TTFT p99", "x fcfs")]
    lines = []
    for r in rows:
        cells = [r["name"], f"{r['wall']:.1f}", f"{r['tok_s']:.0f}"]
        cells += [f"{r['tok_s'] / base['tok_s']:.2f}", f"{100 * r['hit']:.1f}%"]
        for c in classes:
            cells += [f"{r.get(c, float('nan')):.2f}", f"{r.get(c, 0) / base.get(c, 1):.2f}"]
        lines.append(tuple(cells))
    print(title)
    print(format_table(tuple(header), lines))


REAL_OPEN_LOOP_CLIENTS = 512  # client threads of an open-loop real run: more than ever wait


def real_rows(args: argparse.Namespace, trace: Trace, name: str) -> None:
    """The real Engine on the tiny model against the simulator's replay, per system."""
    from radixserve.bench.clients import EngineClient
    from radixserve.bench.models import ensure_bench_model
    from radixserve.bench.runner import run_sessions
    from radixserve.server.engine import Engine
    from radixserve.sim.calibrate import calibrate

    model = str(ensure_bench_model("tiny"))
    cost = calibrate(
        EngineConfig.from_flat(model_path=model, dtype="float32", num_threads=args.threads)
    )
    sessions, classes = trace
    open_loop = is_open_loop(sessions)
    clients = REAL_OPEN_LOOP_CLIENTS if open_loop else args.clients
    rows = []
    for system in args.real_systems.split(","):
        config = engine_config(args, system, model_path=model, dtype="float32")
        config = config.replace(num_threads=args.threads)
        engine = Engine(model, **_fields(config))
        try:
            records, wall, _ = run_sessions(EngineClient(engine), sessions, clients, system)
            engine.check_integrity()
        finally:
            engine.shutdown()
        real = row(f"{system} real", records, wall, classes)
        sim = simulate(args, system, trace, cost)
        sim["name"] = f"{system} sim"
        rows += [real, sim]
        print(
            f"{system}: wall real {real['wall']:.1f} s, sim {sim['wall']:.1f} s "
            f"({100 * (sim['wall'] / real['wall'] - 1):+.1f}%); hit real {100 * real['hit']:.1f}%"
            f", sim {100 * sim['hit']:.1f}%"
        )
    loop = f"open loop at {args.real_rate}/s" if open_loop else f"{args.clients} clients"
    title = f"real vs sim, {name} trace, {len(sessions)} requests, {loop}"
    print_table(title, rows, sorted(set(classes.values())))


def _fields(config: EngineConfig) -> dict[str, Any]:
    return {k: v for k, v in config.flat().items() if k != "model_path"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--traces", default="pressure,starvation,long")
    add("--systems", default=",".join(SYSTEMS), help="POLICY[+age=N][+il], comma-separated")
    add("--requests", type=int, default=20000)
    add("--groups", type=int, default=64)
    add("--prefix", type=int, default=1024)
    add("--zipf", type=float, default=1.0)
    add("--question", type=int, default=48)
    add("--output", type=int, default=16)
    add("--cold-frac", type=float, default=0.1)
    add("--cold-len", type=int, default=512)
    add("--long-frac", type=float, default=0.005)
    add("--long-len", type=int, default=8192)
    add("--short-len", type=int, default=256)
    add("--long-rate", type=float, default=4.0, help="arrivals/s of the long trace (open loop)")
    add("--rate", type=float, default=0.0, help="> 0: the pressure trace open loop at this rate")
    add("--clients", type=int, default=96)
    add("--kv-tokens", type=int, default=16384)
    add("--long-kv-tokens", type=int, default=65536, help="the pool of the long trace")
    add("--max-running", type=int, default=32)
    add("--cost", default="tiny-cpu")
    add("--token-range", type=lambda s: tuple(map(int, s.split("-"))), default=(3, 2000))
    add("--real", type=int, default=0, help="run this many pressure requests on the real Engine")
    add("--real-systems", default="fcfs,lpm,hrrn")
    add("--real-rate", type=float, default=0.0, help="> 0: the real run open loop at this rate")
    add("--real-trace", default="pressure", choices=["pressure", "starvation"])
    add("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    cost = CostModel.load(args.cost)
    for name in filter(None, args.traces.split(",")):  # --traces "": the real run alone
        trace = TRACES[name](args, args.requests)
        classes = sorted(set(trace[1].values()))
        run_args = args
        if name == "long":
            run_args = argparse.Namespace(**{**vars(args), "kv_tokens": args.long_kv_tokens})
        rows = [simulate(run_args, s, trace, cost) for s in args.systems.split(",")]
        n, kv = len(trace[0]), run_args.kv_tokens
        print_table(f"\n{name}: {n} requests, KV {kv}, cost {args.cost}", rows, classes)
    if args.real:
        real_args = argparse.Namespace(**{**vars(args), "rate": args.real_rate})
        real_rows(args, TRACES[args.real_trace](real_args, args.real), args.real_trace)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
