"""Speed work must not change what the simulator computes.

Each case runs a fixed-seed simulation and hashes everything it produced: every record's
send, first-token and completion times on the virtual clock (exact float reprs), its replica,
cached tokens and output ids, plus the counters and the number of steps. The expected digests
were taken on the code before the speed work (commit 5593222); a change of any scheduling
decision, eviction order, token or clock value changes them. If a deliberate behaviour change
moves them, recompute with ``python tests/sim/test_sim_golden.py`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import sys

import pytest

from radixserve.bench.workload import (
    MultiTurnSpec,
    SharedPrefixSpec,
    make_multiturn,
    make_shared_prefix,
)
from radixserve.config import EngineConfig
from radixserve.sim.cost_model import CostModel
from radixserve.sim.simulation import SimOptions, Simulation
from radixserve.sim.sweep import aging_constants
from radixserve.sim.trace import SimSession, from_bench_sessions

CASES: dict[str, dict[str, object]] = {
    # a pool far below the working set: eviction on most steps, retraction, chunked prefill
    "shared-fcfs-small-pool": dict(trace="shared", kv=3000, policy="fcfs"),
    "shared-lpm-small-pool": dict(trace="shared", kv=3000, policy="lpm"),
    "multiturn-fcfs-page4": dict(trace="multi", kv=1200, policy="fcfs", page=4),
    "shared-dfs-roomy": dict(trace="shared", kv=40000, policy="dfs-weight"),
    # long outputs over a tight pool: the decay of new_token_ratio over-admits, decode retracts
    "shared-long-outputs-retract": dict(trace="shared", kv=2500, policy="fcfs", out=150),
    "multiturn-lpm-dp2-cache-aware": dict(
        trace="multi", kv=1500, policy="lpm", dp=2, router="cache_aware"
    ),
    "multiturn-fcfs-dp2-power-of-two": dict(
        trace="multi", kv=900, policy="fcfs", dp=2, router="power_of_two", chunk=64
    ),
    # prefill interleaving (on by default; the cases above pin the scheduler without it):
    # chunks of 64 with short turns queued behind them
    "multiturn-fcfs-chunk64-interleaved": dict(
        trace="multi", kv=900, policy="fcfs", chunk=64, interleave=True
    ),
    "multiturn-hrrn-chunk64-interleaved": dict(
        trace="multi", kv=900, policy="hrrn", chunk=64, interleave=True
    ),
    # the cases above pin LPM's and DFS-weight's aging by passes (8); these pin aging by
    # admissions (factor 2), the default
    "shared-dfs-roomy-aging-by-admissions": dict(
        trace="shared", kv=40000, policy="dfs-weight", aging="admissions"
    ),
    "multiturn-adaptive-dp2-aging-by-admissions": dict(
        trace="multi", kv=1500, policy="adaptive", dp=2, router="cache_aware", aging="admissions"
    ),
}

EXPECTED = {
    "shared-fcfs-small-pool": "53a0bd0a46539dd8c7253423214815db41e417fd984688f57c90e0f3f6334011",
    "shared-lpm-small-pool": "90272ee6db719fe8e1bdcf9593ef04c6e42e3d786059a543d6eeb59dae5f1336",
    "multiturn-fcfs-page4": "b5340fe79fba533e315bda3280f21765b0c59004e190ff5aaa714a4dec8eed36",
    "shared-dfs-roomy": "9cdbc3dc51474d1a07430649690c2861ec5e279d1f14e73518b5f52b33e52f63",
    "shared-long-outputs-retract": "0345ff87bf7f90b51fcbd4ebce8051b9a151babb80551f3dbe00ec0961d416bd",
    "multiturn-lpm-dp2-cache-aware": "d756218ab9500e6fef0b5ffb1ce35a1f5617e2cf726adc8acdc295994e56991e",
    "multiturn-fcfs-dp2-power-of-two": "1c4aad014b9c8a01c043d983cbb99a5bc920222a25a2b5c65ac724f7f5c3c667",
    "multiturn-fcfs-chunk64-interleaved": "c2575784a4d0429369fea2d2ba234ea6bd871bcb1cc824467b6fce601d08cfbf",
    "multiturn-hrrn-chunk64-interleaved": "66a9fb7695b77af1aa022a8d4861f6672e6337a693dbcc3302fca9752b94c964",
    "shared-dfs-roomy-aging-by-admissions": "f7aeedf038e48da66831f1adfee1f5d92592cd069b53f3d3176d143c4b481744",
    "multiturn-adaptive-dp2-aging-by-admissions": "69900158eb7261731b63d747d28055a2c289cc8ad058af6a26ba4fc6898c8088",
}


def _sessions(kind: object, out: int) -> list[SimSession]:
    if kind == "shared":
        spec = SharedPrefixSpec(
            num_groups=6, prompts_per_group=40, system_len=300, question_len=40, output_len=out
        )
        return from_bench_sessions(make_shared_prefix(spec, 3, 32000))
    spec_m = MultiTurnSpec(
        num_conversations=10, num_turns=4, user_len=(30, 90), answer_len=(8, 40), seed=3
    )
    return from_bench_sessions(make_multiturn(spec_m, 3, 32000))


def digest(case: dict[str, object]) -> str:
    config = EngineConfig.from_flat(
        max_total_tokens=int(case["kv"]),  # type: ignore[call-overload]
        schedule_policy=str(case["policy"]),
        page_size=int(case.get("page", 1)),  # type: ignore[call-overload]
        chunked_prefill_size=int(case.get("chunk", 8192)),  # type: ignore[call-overload]
        max_running_requests=16,
        disable_overlap_schedule=True,
        enable_prefill_interleaving=bool(case.get("interleave", False)),
    )
    if case.get("aging", "passes") == "passes":  # the default the digests were taken with
        config = config.replace(constants=aging_constants(config.admission.constants, "passes"))
    cost = CostModel.load("tiny-cpu")
    opts = SimOptions(
        config,
        cost,
        dp_size=int(case.get("dp", 1)),  # type: ignore[call-overload]
        router_policy=str(case.get("router", "round_robin")),
        parallel=16,
        seed=7,
    )
    out = int(case.get("out", 12))  # type: ignore[call-overload]
    result = Simulation(opts, _sessions(case["trace"], out)).run()
    h = hashlib.sha256()
    for r in result.records:
        row = (r.sid, r.turn, r.replica, r.sent_s, r.first_token_s, r.done_s, r.cached_tokens)
        h.update(repr(row).encode())
        h.update(r.prompt_ids.tobytes())
        h.update(repr(r.output_ids).encode())
    h.update(repr((result.wall_s, sorted(result.counters.items()), result.num_steps)).encode())
    h.update(repr(result.load_split).encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", list(CASES))
def test_simulation_output_is_unchanged(name: str) -> None:
    assert digest(CASES[name]) == EXPECTED[name]


if __name__ == "__main__":
    for name, case in CASES.items():
        print(f'    "{name}": "{digest(case)}",', file=sys.stdout)
