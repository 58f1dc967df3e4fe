"""How fast ``radixserve sim`` replays the shared-prefix trace through the real scheduler.

The bench's shared-prefix shape (system 512, question 64, output 16 tokens, 64 clients) scaled
to ``--requests`` (default 100,000: 100 groups x 1,000 prompts, 57.6 M prompt tokens), one
replica with a ``--kv-tokens`` pool. Prints the trace build time, the simulation's wall time,
its scheduler steps per second, and the simulated run's table. Goal: < 2 min for 100,000.

    python benchmarks/sim_speed.py                      # 100,000 requests
    python benchmarks/sim_speed.py --requests 10000 --policy lpm
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from radixserve.bench.workload import SharedPrefixSpec
from radixserve.config import EngineConfig
from radixserve.sim.cost_model import CostModel
from radixserve.sim.simulation import SimOptions, Simulation
from radixserve.sim.summary import sim_table, summarize
from radixserve.sim.trace import num_requests, shared_prefix_sessions


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--kv-tokens", type=int, default=200_000)
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--cost", default="tiny-cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    t0 = time.perf_counter()
    spec = SharedPrefixSpec(
        num_groups=args.groups, prompts_per_group=args.requests // args.groups, seed=0
    )
    sessions = shared_prefix_sessions(spec, 3, 32000)
    t1 = time.perf_counter()
    config = EngineConfig.from_flat(
        max_total_tokens=args.kv_tokens,
        schedule_policy=args.policy,
        max_running_requests=args.max_running,
        disable_overlap_schedule=True,
    )
    sim = Simulation(SimOptions(config, CostModel.load(args.cost), parallel=64), sessions)
    result = sim.run()
    t2 = time.perf_counter()
    summary = summarize(f"sim {args.policy}", result)
    t3 = time.perf_counter()
    n = num_requests(sessions)
    prompt_tokens = summary["input_tokens"]
    print(
        f"{n} requests, {prompt_tokens / 1e6:.1f} M prompt tokens, KV pool {args.kv_tokens}: "
        f"trace {t1 - t0:.1f} s, simulation {t2 - t1:.1f} s ({result.num_steps} steps, "
        f"{result.num_steps / (t2 - t1):.0f} steps/s, {n / (t2 - t1):.0f} requests/s), "
        f"summary {t3 - t2:.1f} s; total {t3 - t0:.1f} s "
        f"({'under' if t3 - t0 < 120 else 'OVER'} 2 min)"
    )
    print(f"load average at start {load[0]:.2f} {load[1]:.2f}, at end {os.getloadavg()[0]:.2f}")
    print(sim_table([summary]))


if __name__ == "__main__":
    main()
