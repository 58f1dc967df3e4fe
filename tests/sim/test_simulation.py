"""The simulator runs the real scheduler on a virtual clock: every request finishes, the KV
stays consistent, and the clock is exactly what the cost model says."""

from __future__ import annotations

import numpy as np
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
from radixserve.sim.summary import optimal_hits, summarize
from radixserve.sim.trace import SimSession, SimTurn, from_bench_sessions

COST = CostModel(prefill_base=1.0, prefill_per_token=0.1, decode_base=0.5, decode_per_req=0.25)


def _config(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(max_total_tokens=4096, disable_overlap_schedule=True)
    base.update(kw)
    return EngineConfig.from_flat(**base)  # type: ignore[arg-type]


def _one(
    sid: int, n: int, out: int, at: float = 0.0, prefix: np.ndarray | None = None
) -> SimSession:
    user = np.arange(100 + 1000 * sid, 100 + 1000 * sid + n, dtype=np.int32)
    return SimSession(sid, prefix if prefix is not None else user[:0], (SimTurn(user, out),), at)


def test_virtual_clock_matches_the_cost_model_by_hand() -> None:
    # request 0 at t=0: prefill of 10 tokens = 1 + 0.1*10 = 2.0 (first token), then two decode
    # steps of one request, 0.5 + 0.25 each: done at 3.5.
    # request 1 at t=10: the same shape from t=10: first token 12.0, done 13.5.
    sessions = [_one(0, 10, 3), _one(1, 10, 3, at=10.0)]
    result = Simulation(SimOptions(_config(), COST, parallel=None), sessions).run()
    r0, r1 = result.records
    assert (r0.sent_s, r0.first_token_s, r0.done_s) == (0.0, 2.0, 3.5)
    assert (r1.sent_s, r1.first_token_s, r1.done_s) == (10.0, 12.0, 13.5)
    assert result.wall_s == 13.5
    assert [len(r.output_ids) for r in result.records] == [3, 3]


def test_two_at_once_share_steps_and_the_closed_loop_waits() -> None:
    # both at t=0, one client each: one prefill of 20 tokens = 3.0; decode of 2 = 1.0 per step
    # (0.5 + 2 * 0.25): done at 5.0. With one client the second is sent only at the first's end.
    sessions = [_one(0, 10, 3), _one(1, 10, 3)]
    both = Simulation(SimOptions(_config(), COST, parallel=None), sessions).run()
    assert [r.first_token_s for r in both.records] == [3.0, 3.0]
    assert [r.done_s for r in both.records] == [5.0, 5.0]
    serial = Simulation(SimOptions(_config(), COST, parallel=1), sessions).run()
    assert [(r.sent_s, r.done_s) for r in serial.records] == [(0.0, 3.5), (3.5, 7.0)]


def test_cache_hit_is_counted_and_costs_less() -> None:
    # request 1 shares request 0's 50-token prefix: it computes 10 + 1 tokens, not 60
    prefix = np.arange(5000, 5050, dtype=np.int32)
    sessions = [_one(0, 10, 2, prefix=prefix), _one(1, 10, 2, at=100.0, prefix=prefix)]
    result = Simulation(SimOptions(_config(), COST, parallel=None), sessions).run()
    r0, r1 = result.records
    assert r0.cached_tokens == 0 and r1.cached_tokens == 50
    assert r0.first_token_s - r0.sent_s == pytest.approx(1.0 + 0.1 * 60)
    assert r1.first_token_s - r1.sent_s == pytest.approx(1.0 + 0.1 * 10)
    assert optimal_hits(result.records) == [0, 50]


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
@pytest.mark.parametrize(
    "dp_size,router", [(1, "round_robin"), (2, "cache_aware"), (2, "cache_aware_events")]
)
def test_small_pool_finishes_everything_with_integrity(
    policy: str, dp_size: int, router: str
) -> None:
    """A pool far smaller than the trace: eviction, retraction, chunked prefill all happen; the
    KV invariant holds after every step and every request gets exactly its output."""
    sessions = from_bench_sessions(
        make_multiturn(
            MultiTurnSpec(num_conversations=6, num_turns=3, user_len=(40, 90), answer_len=(20, 60)),
            3,
            500,
        )
    )
    config = _config(max_total_tokens=700, schedule_policy=policy, chunked_prefill_size=64)
    opts = SimOptions(
        config, COST, dp_size=dp_size, router_policy=router, parallel=6, check_integrity_every=1
    )
    sim = Simulation(opts, sessions)
    result = sim.run()
    assert len(result.records) == 18
    by_turn = {(s.sid, i): t.output_len for s in sessions for i, t in enumerate(s.turns)}
    for r in result.records:
        assert r.done_s is not None and len(r.output_ids) == by_turn[(r.sid, r.turn)]
    for rep in sim.replicas:
        rep.scheduler.check_integrity()
        assert not rep.scheduler.has_work
    summary = summarize("x", result)
    assert 0 < summary["hit_rate"] <= summary["optimal_hit_rate"] + 1e-9


def test_a_multiturn_prompt_contains_the_simulated_answer() -> None:
    sessions = from_bench_sessions(make_multiturn(MultiTurnSpec(num_conversations=1), 3, 500))
    result = Simulation(SimOptions(_config(), COST), sessions).run()
    t0, t1 = result.records[0], result.records[1]
    n0 = len(t0.prompt_ids)
    assert t1.sent_s == t0.done_s
    assert t1.prompt_ids[:n0].tolist() == t0.prompt_ids.tolist()
    assert t1.prompt_ids[n0 : n0 + len(t0.output_ids)].tolist() == t0.output_ids
    assert t1.cached_tokens >= n0  # the first turn and its answer (minus the last token) cached


def test_shared_prefix_hit_rate_is_near_optimal() -> None:
    spec = SharedPrefixSpec(num_groups=3, prompts_per_group=6, system_len=200, question_len=20)
    sessions = from_bench_sessions(make_shared_prefix(spec, 3, 500))
    s = summarize("x", Simulation(SimOptions(_config(), COST, parallel=8), sessions).run())
    assert s["num_requests"] == 18
    assert s["hit_rate"] == pytest.approx(s["optimal_hit_rate"], abs=0.1)


def test_a_request_the_pool_cannot_hold_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="KV slots"):
        Simulation(SimOptions(_config(max_total_tokens=64), COST), [_one(0, 100, 4)]).run()


def test_lora_sessions_hit_only_their_own_adapters_cache() -> None:
    """Shared system prompts under 4 adapters: each adapter computes each system prompt once
    (the hit rate equals the optimal per namespace, below the trace's optimal without
    adapters), and no batch holds more than max_loras_per_batch adapters."""
    from dataclasses import replace

    spec = SharedPrefixSpec(num_groups=2, prompts_per_group=8, system_len=64, question_len=8)
    plain = from_bench_sessions(make_shared_prefix(spec, 5, 1000))
    tagged = [replace(s, lora=f"lora{s.sid % 4}") for s in plain]
    config = _config(max_loras_per_batch=2)
    base = summarize("base", Simulation(SimOptions(config, COST), plain).run())
    sim = Simulation(SimOptions(config, COST, check_integrity_every=1), tagged)
    seen: list[set[str]] = []
    scheduler = sim.replicas[0].scheduler
    forward_lora = scheduler.loras.forward_lora

    def recording(reqs, counts, keep=()):  # type: ignore[no-untyped-def]
        seen.append({r.lora_id for r in (*reqs, *keep) if r.lora_id is not None})
        return forward_lora(reqs, counts, keep)

    scheduler.loras.forward_lora = recording  # type: ignore[method-assign]
    result = sim.run()
    lora = summarize("lora", result)
    assert all(len(r.output_ids) == r.output_len for r in result.records)
    assert lora["hit_rate"] == lora["optimal_hit_rate"] < base["optimal_hit_rate"]
    # per adapter: 2 system prompts of 64 tokens computed once each, then hit
    assert {r.lora for r in result.records} == {"lora0", "lora1", "lora2", "lora3"}
    assert max(len(s) for s in seen) == 2
    scheduler.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_event_router_knows_exactly_what_each_replica_holds(page_size: int) -> None:
    """``cache_aware_events``: after a run that evicts, the router's picture of each replica,
    built from that replica's KV events alone, is its tree's pages (no more, no fewer)."""
    from radixserve.radix.kv_events import KVEventRecorder

    sessions = from_bench_sessions(
        make_multiturn(
            MultiTurnSpec(num_conversations=12, num_turns=3, user_len=(40, 90), answer_len=(8, 20)),
            5,
            500,
        )
    )
    config = _config(max_total_tokens=900, page_size=page_size)
    opts = SimOptions(config, COST, dp_size=3, router_policy="cache_aware_events", parallel=6)
    sim = Simulation(opts, sessions)
    summary = summarize("events", sim.run())
    assert summary["hit_rate"] > 0.2
    assert sim.router.num_cache_routed > 0
    for i, rep in enumerate(sim.replicas):
        tree = rep.kv.tree
        hashes: set[int] = set()
        stack = list(tree.root.children.values())
        while stack:
            node = stack.pop()
            hashes.update(KVEventRecorder(page_size)._hashes(node))
            stack.extend(node.children.values())
        assert set(sim.router._held[i]) == hashes, f"replica {i}"
