"""SGLang issue 31954 in the simulator: LPM starves cache-cold requests behind a hot group.

Trace: a hot prefix group (``--hot`` requests sharing a ``--hot-prefix``-token prefix, a short
unique question each) with ``--cold`` cold requests (unique prompts, no prefix to match)
spread evenly among them; ``--clients`` closed-loop clients keep the queue below LPM's
128-request FCFS fallback, so LPM sorts every pass; a small KV pool. Every policy replays the
same trace; printed: p99 TTFT of cold and of hot requests and the hit rate, LPM with its default aging on
(by admissions, ``SchedulerConstants.aging_work_factor``) and off, and HRRN (which ages by work done: aging "work").

    python benchmarks/sim_starvation.py
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from radixserve.bench.records import percentiles
from radixserve.bench.report import format_table
from radixserve.config import EngineConfig
from radixserve.sim.cost_model import CostModel
from radixserve.sim.simulation import SimOptions, Simulation
from radixserve.sim.trace import SimSession, SimTurn


def trace(hot: int, cold: int, hot_prefix: int, seed: int) -> tuple[list[SimSession], set[int]]:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, 32000, hot_prefix, dtype=np.int32)
    every = max(hot // max(cold, 1), 1)
    sessions: list[SimSession] = []
    cold_ids: set[int] = set()
    for i in range(hot + cold):
        is_cold = i % (every + 1) == every and len(cold_ids) < cold
        user = rng.integers(3, 32000, 384 if is_cold else 32, dtype=np.int32)
        pre = prefix[:0] if is_cold else prefix
        sessions.append(SimSession(i, pre, (SimTurn(user, 16),)))
        if is_cold:
            cold_ids.add(i)
    return sessions, cold_ids


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hot", type=int, default=2000)
    p.add_argument("--cold", type=int, default=40)
    p.add_argument("--hot-prefix", type=int, default=1024)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--kv-tokens", type=int, default=8192)
    p.add_argument("--cost", default="tiny-cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    sessions, cold = trace(args.hot, args.cold, args.hot_prefix, 0)
    cost = CostModel.load(args.cost)
    rows = []
    for policy, aging in (
        ("fcfs", True),
        ("lpm", False),
        ("lpm", True),
        ("dfs-weight", False),
        ("dfs-weight", True),
        ("hrrn", True),
    ):
        config = EngineConfig.from_flat(
            max_total_tokens=args.kv_tokens,
            schedule_policy=policy,
            max_running_requests=32,
            disable_overlap_schedule=True,
        )
        if not aging:
            config = config.replace(constants=config.admission.constants.without_aging())
        result = Simulation(SimOptions(config, cost, parallel=args.clients), sessions).run()
        ttft: dict[bool, list[float]] = {True: [], False: []}  # cold -> TTFTs
        for r in result.records:
            assert r.first_token_s is not None
            ttft[r.sid in cold].append(r.first_token_s - r.sent_s)
        c, h = percentiles(ttft[True]), percentiles(ttft[False])
        assert c is not None and h is not None
        hit = sum(r.cached_tokens for r in result.records) / sum(
            len(r.prompt_ids) for r in result.records
        )
        aging_text = {"fcfs": "-", "hrrn": "work"}.get(policy, "on" if aging else "off")
        rows.append(
            (
                policy,
                aging_text,
                f"{c['p50']:.2f}",
                f"{c['p99']:.2f}",
                f"{h['p50']:.2f}",
                f"{h['p99']:.2f}",
                f"{100 * hit:.1f}%",
                f"{result.wall_s:.1f}",
            )
        )
    print(
        f"{args.hot} hot requests ({args.hot_prefix}-token shared prefix) + {args.cold} cold, "
        f"{args.clients} clients, KV {args.kv_tokens} tokens, cost {args.cost}; virtual seconds"
    )
    header = (
        "policy",
        "aging",
        "cold TTFT p50",
        "cold TTFT p99",
        "hot TTFT p50",
        "hot TTFT p99",
        "hit",
        "wall s",
    )
    print(format_table(header, rows))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
