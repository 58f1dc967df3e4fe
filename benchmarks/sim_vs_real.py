"""The simulator against the real runtime on bench shapes (a) and (b), side by side in one run.

For each shape: the real in-process Engine runs the trace as ``radixserve bench`` does (the
same generator, seed, clients and greedy ``ignore_eos`` requests), then ``radixserve sim``
replays the same sessions with a cost model calibrated on the same model right before, with
the Engine's KV pool size. Printed: wall time and hit rate of both, and their differences
(goal: wall within 15%, hit rate within 1 point).

    python benchmarks/sim_vs_real.py                    # the tiny model
    python benchmarks/sim_vs_real.py --model DIR --dtype float32
"""

from __future__ import annotations

import argparse
import os

import torch

from radixserve.bench.clients import EngineClient
from radixserve.bench.models import ensure_bench_model, token_range
from radixserve.bench.records import summarize as bench_summarize
from radixserve.bench.runner import run_sessions, warmup
from radixserve.bench.workload import MULTITURN_SHAPES, MultiTurnSpec, TokenSource, make_multiturn
from radixserve.config import EngineConfig
from radixserve.server.engine import Engine
from radixserve.sim.calibrate import calibrate
from radixserve.sim.simulation import SimOptions, Simulation
from radixserve.sim.summary import sim_table, summarize
from radixserve.sim.trace import from_bench_sessions


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None, help="default: the tiny bench model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--shapes", default="a,b")
    args = p.parse_args()
    model = args.model or str(ensure_bench_model("tiny"))
    low, high = token_range(model)
    torch.set_num_threads(args.threads)
    print(f"load average at start: {os.getloadavg()}")
    cost = calibrate(
        EngineConfig.from_flat(model_path=model, dtype=args.dtype, num_threads=args.threads)
    )
    print(f"cost model: {cost.to_json()}")
    rows = []
    for shape in args.shapes.split(","):
        p_ = MULTITURN_SHAPES[shape]
        spec = MultiTurnSpec(
            num_conversations=p_["conversations"],
            num_turns=p_["turns"],
            user_len=p_["user_len"],
            answer_len=p_["answer_len"],
            parallel=p_["parallel"],
        )
        sessions = make_multiturn(spec, low, high)
        engine = Engine(model, dtype=args.dtype, num_threads=args.threads)
        try:
            client = EngineClient(engine)
            warmup(client, TokenSource(low, high, 1))
            records, wall, stats = run_sessions(client, sessions, spec.parallel, f"real {shape}")
            kv_tokens = int(engine.get_stats()["max_total_tokens"])
        finally:
            engine.shutdown()
        real = bench_summarize(f"real ({shape})", records, wall, {"server_stats": stats})
        real.update(stats or {})
        config = EngineConfig.from_flat(max_total_tokens=kv_tokens, disable_overlap_schedule=True)
        opts = SimOptions(config, cost, parallel=spec.parallel, token_range=(low, high))
        sim = summarize(f"sim ({shape})", Simulation(opts, from_bench_sessions(sessions)).run())
        rows += [real, sim]
        dw = sim["wall_s"] / real["wall_s"] - 1
        dh = 100 * (sim["hit_rate"] - real["hit_rate"])
        print(
            f"shape {shape}: wall real {real['wall_s']:.2f} s, sim {sim['wall_s']:.2f} s "
            f"({100 * dw:+.1f}%, goal within 15%); hit real {100 * real['hit_rate']:.1f}%, "
            f"sim {100 * sim['hit_rate']:.1f}% ({dh:+.2f} points, goal within 1)"
        )
    print(sim_table(rows))
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
