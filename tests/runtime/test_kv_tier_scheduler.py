"""The KV tier through the real Scheduler, policy, TieredRadixCache and KVManager, with the fake
worker playing the KV (``fake_worker.kv_codes``): every forward checks that the cached slots it
reads, loaded back from the tier or not, hold the KV of exactly their prefix. Integrity (pool
and tier) is checked after every step; outputs must equal decoding each request alone.
"""

from __future__ import annotations

import pytest
from fake_worker import fake_scheduler
from test_kv_manager import (
    PAGE_SIZES,
    assert_pool_back_to_full,
    drive,
    reference_output,
    request,
    shared_prefix_requests,
)

from radixserve.types import FinishKind


def assert_tier_back_to_empty(sched) -> None:
    tier = sched.kv.tiered.tier
    assert tier.available_size() == tier.capacity  # flush_cache forgot the tier too


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_evicted_prefixes_come_back_from_the_tier(page_size: int, overlap: bool, policy) -> None:
    reqs = shared_prefix_requests(4, 4, page_size)

    def run(tier_tokens: int | None):
        sched, worker = fake_scheduler(
            page_size,
            capacity=320,
            chunked_prefill_size=32,
            overlap=overlap,
            schedule_policy="lpm",
            tier_tokens=tier_tokens,
            kv_tier_write_policy=policy,
        )
        for r in reqs:
            sched.add_request(r)
        done = drive(sched)
        # the same requests again: the first round's prefixes were evicted from the pool
        again = [request(r.input_ids, r.sampling_params.max_new_tokens) for r in reqs]
        for r in again:
            sched.add_request(r)
        done |= drive(sched)
        for r in [*reqs, *again]:
            expected = reference_output(r.input_ids, r.sampling_params.max_new_tokens)
            assert done[r.rid] == (expected, FinishKind.LENGTH)
        return sched, worker

    sched, worker = run(tier_tokens=4096)
    stats = sched.get_stats()
    assert stats["num_cached_prompt_tokens_tier"] > 0
    # (requests of one batch that share a tier prefix all count it; it is loaded once)
    assert 0 < stats["kv_tier_loaded_tokens"] <= stats["num_cached_prompt_tokens_tier"]
    plain, plain_worker = run(tier_tokens=None)
    # the tier computes fewer tokens than the pool alone (cached_tokens is not compared: it
    # sums over re-admissions, and the pool alone retracts more)
    assert sum(worker.computed.values()) < sum(plain_worker.computed.values())
    assert_pool_back_to_full(sched)
    assert_tier_back_to_empty(sched)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_a_tier_smaller_than_the_trace_evicts_its_own_lru(page_size: int) -> None:
    sched, _ = fake_scheduler(page_size, capacity=160, chunked_prefill_size=32, tier_tokens=192)
    reqs = [request([1 + (g * 131 + i) % 997 for i in range(60)], max_new=8) for g in range(10)]
    for r in [*reqs, *reqs[::-1]]:
        sched.add_request(request(r.input_ids, 8))
    done = drive(sched)
    assert len(done) == 20
    for outputs, kind in done.values():
        assert kind is FinishKind.LENGTH and len(outputs) == 8
    assert sched.get_stats()["kv_tier_used_tokens"] <= sched.kv.tiered.tier.capacity
    assert_pool_back_to_full(sched)


def preempt_run(page_size: int, tier_tokens: int | None, mode: str):
    """Four long low-priority requests; at step 3 an urgent one preempts, and a flood of
    medium-priority prompts evicts what the victims cached in the pool while they wait."""
    sched, worker = fake_scheduler(
        page_size,
        capacity=192,
        enable_priority_scheduling=True,
        chunked_prefill_size=None,
        tier_tokens=tier_tokens,
        preemption_mode=mode,
    )
    low = [request([200 + 11 * i + k for k in range(30)], max_new=40) for i in range(4)]
    for r in low:
        sched.add_request(r)
    low_reqs = [sched.reqs[r.rid] for r in low]  # kept: finished requests leave sched.reqs
    later = [request(list(range(300, 400)), max_new=10, priority=100)]
    later += [request([500 + 13 * i + k for k in range(60)], 4, priority=50) for i in range(3)]

    def arrive(step: int) -> None:
        if step == 3:
            for r in later:
                sched.add_request(r)

    done = drive(sched, on_step=arrive)
    for r in [*low, *later]:
        assert done[r.rid][0] == reference_output(r.input_ids, r.sampling_params.max_new_tokens)
    assert any(r.num_preemptions for r in low_reqs)
    # each token computed once, and per time sent back at most a partial page again
    recomputed = [
        worker.computed[r.rid]
        - (30 + 40)
        - (r.num_preemptions + r.num_retractions) * (page_size - 1)
        for r in low_reqs
    ]
    return sched, recomputed


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_priority_preemption_in_swap_mode_resumes_without_recomputing(page_size: int) -> None:
    sched, recomputed = preempt_run(page_size, tier_tokens=2048, mode="swap")
    assert sched.get_stats()["num_swapped_out_tokens"] > 0
    assert max(recomputed) <= 0
    assert_pool_back_to_full(sched)
    assert_tier_back_to_empty(sched)
    # the same run with no tier: the victims' prompts were evicted and computed again
    plain, plain_recomputed = preempt_run(page_size, tier_tokens=None, mode="recompute")
    assert max(plain_recomputed) > 0
    assert_pool_back_to_full(plain)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_decode_retraction_swaps_and_an_aborted_swapped_request_unpins(page_size: int) -> None:
    sched, worker = fake_scheduler(
        page_size, capacity=384, chunked_prefill_size=64, tier_tokens=2048, preemption_mode="swap"
    )
    reqs = [request([100 + 7 * i + k for k in range(20)], max_new=60) for i in range(8)]
    for r in reqs:
        sched.add_request(r)
    aborted: list[str] = []

    def abort_a_swapped_one(step: int) -> None:
        swapped = [r for r in sched.waiting if r.swap_node is not None]
        if swapped and not aborted:
            aborted.append(swapped[-1].rid)
            sched.abort_request(swapped[-1].rid)

    done = drive(sched, on_step=abort_a_swapped_one)
    assert sched.stats.num_retractions > 0 and sched.get_stats()["num_swapped_out_tokens"] > 0
    assert len(aborted) == 1 and done[aborted[0]][1] is FinishKind.ABORT
    for r in reqs:
        if r.rid not in aborted:
            assert done[r.rid] == (reference_output(r.input_ids, 60), FinishKind.LENGTH)
    assert_pool_back_to_full(sched)
    assert_tier_back_to_empty(sched)
