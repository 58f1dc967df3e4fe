"""Anti-starvation aging: a cold request among a stream of cache hits is served in bounded time."""

from __future__ import annotations

import pytest
from policy_helpers import cache_tokens, make_req, new_adder, pool

from radixserve.config import SchedulerConstants
from radixserve.policy import SchedulePolicy
from radixserve.types import Req

HOT_PREFIX = list(range(1000, 1064))


def passes_until_admitted(
    policy_name: str,
    max_skipped_passes: int,
    *,
    num_passes: int = 60,
    arrivals_per_pass: int = 3,
    work_factor: float | None = None,
    hits_before: int = 0,
) -> int | None:
    """Run admission passes with room for 2 new requests each; ``arrivals_per_pass`` cache-hit
    requests arrive every pass (``hits_before`` more were waiting before the cold request).
    Aging by passes (``max_skipped_passes``) alone, or by admissions alone (``work_factor``).
    Returns the pass (1-based) that admits the cold request."""
    tree, alloc = pool(4096)
    cache_tokens(tree, alloc, HOT_PREFIX)
    constants = SchedulerConstants(max_skipped_passes=max_skipped_passes, aging_work_factor=0.0)
    if work_factor is not None:  # aging by admissions instead
        constants = SchedulerConstants(max_skipped_passes=0, aging_work_factor=work_factor)
    policy = SchedulePolicy(policy_name, tree, constants)
    early = [make_req([*HOT_PREFIX, 9_000 + i], arrival=-1.0 - i) for i in range(hits_before)]
    cold = make_req(range(5000, 5040), arrival=0.0, rid="cold")
    waiting: list[Req] = [*early, cold]
    clock = 0.0
    for pass_no in range(1, num_passes + 1):
        for _ in range(arrivals_per_pass):
            clock += 1.0
            suffix = [20_000 + int(clock) * 8 + i for i in range(4)]
            waiting.append(make_req(HOT_PREFIX + suffix, arrival=clock))
        ordering = policy.calc_priority(waiting)
        adder = new_adder(tree, alloc, ratio=0.5, max_new_reqs=2, constants=constants)
        plan = adder.plan(waiting, ordering.matches, ordering.deprioritized)
        admitted = plan.reqs
        assert 0 < len(admitted) <= 2
        waiting = [r for r in waiting if r not in admitted]
        policy.on_pass_done(waiting, admitted)
        for admission in plan.admitted:  # they finish at once: release the plan's locks
            tree.dec_lock_ref(admission.match.last_node)
        if cold in admitted:
            return pass_no
    return None


@pytest.mark.parametrize("policy_name", ["lpm", "dfs-weight"])
@pytest.mark.parametrize("bound", [1, 3, 8])
def test_a_cold_request_is_admitted_within_the_bound(policy_name: str, bound: int) -> None:
    admitted_at = passes_until_admitted(policy_name, bound)
    assert admitted_at is not None and admitted_at <= bound + 1
    assert admitted_at == bound + 1  # and not earlier: the hits really do overtake it


@pytest.mark.parametrize("policy_name", ["lpm", "dfs-weight"])
def test_without_aging_the_cold_request_starves(policy_name: str) -> None:
    assert passes_until_admitted(policy_name, max_skipped_passes=0) is None
    assert passes_until_admitted(policy_name, 0, work_factor=0.0, hits_before=2) is None


def test_fcfs_needs_no_aging() -> None:
    assert passes_until_admitted("fcfs", max_skipped_passes=0) == 1


@pytest.mark.parametrize("policy_name", ["lpm", "dfs-weight", "adaptive"])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0])
def test_aging_by_admissions_bounds_the_admissions_before_a_cold_request(
    policy_name: str, factor: float
) -> None:
    """The cold request found 4 hits waiting before it: FCFS would admit it 5th (3rd pass of
    2); with F it goes first once 4 x F requests were admitted, whatever keeps arriving. (An
    ``adaptive`` pass orders by prefix here: the queue's uncached tokens are unknown to fit.)"""
    admitted_at = passes_until_admitted(policy_name, 0, work_factor=factor, hits_before=4)
    assert admitted_at == int(4 * factor) // 2 + 1  # 2 admissions a pass
    assert passes_until_admitted(policy_name, 0, work_factor=0.0, hits_before=4) is None


def test_aging_by_admissions_bounds_how_often_a_request_is_overtaken() -> None:
    """``aging_work_factor`` F: a cold request found behind 2 others ages once 2 x F requests
    have been admitted since, however long the hits keep coming."""
    tree, alloc = pool(4096)
    cache_tokens(tree, alloc, HOT_PREFIX)
    constants = SchedulerConstants(max_skipped_passes=0, aging_work_factor=1.5)
    policy = SchedulePolicy("lpm", tree, constants)
    first = make_req(range(7000, 7100), arrival=0.0, rid="first")
    second = make_req(range(7200, 7300), arrival=0.5, rid="second")
    cold = make_req(range(5000, 5040), arrival=1.0, rid="cold")
    hits = [make_req([*HOT_PREFIX, i], arrival=2.0 + i, rid=f"hit{i}") for i in range(4)]
    queue = [first, second, cold, *hits]
    policy.calc_priority(queue)
    # "first" found nobody before it: FCFS would admit it now, so it is aged at once
    assert queue[0].rid == "first"
    for admitted in (first, hits[0]):  # 2 admissions: below 2 x 1.5 for "cold"
        queue.remove(admitted)
        policy.on_pass_done(queue, [admitted])
    policy.calc_priority(queue)
    assert queue[0].rid == "second"  # found 1 before it: aged after 1.5 admissions
    queue.remove(second)
    policy.on_pass_done(queue, [second])  # the third admission since "cold" arrived
    policy.calc_priority(queue)
    assert queue[0].rid == "cold"
    assert set(policy._deadlines) == {"cold", "hit1", "hit2", "hit3"}


def test_aging_by_admissions_is_the_default_and_off_for_fcfs() -> None:
    assert SchedulerConstants().aging_work_factor == 2.0
    assert SchedulerConstants().max_skipped_passes == 0
    tree, alloc = pool(4096)
    cache_tokens(tree, alloc, HOT_PREFIX)
    queue = [make_req(range(5000, 5040), arrival=1.0, rid="cold")]
    queue.append(make_req([*HOT_PREFIX, 1], arrival=2.0, rid="hit"))
    # "cold" found nobody before it: FCFS would admit it now, so by default it goes first
    SchedulePolicy("lpm", tree).calc_priority(queue, 10**9)
    assert queue[0].rid == "cold"
    SchedulePolicy("lpm", tree, SchedulerConstants().without_aging()).calc_priority(queue, 10**9)
    assert queue[0].rid == "hit"
    fcfs = SchedulePolicy("fcfs", tree, SchedulerConstants(aging_work_factor=1.0))
    fcfs.calc_priority(queue, 10**9)
    assert not fcfs._deadlines


def test_a_long_queue_falling_back_to_fcfs_skips_aging() -> None:
    """Over ``lpm_fallback_queue_len`` LPM orders FCFS, which aging would not change: the pass
    keeps no deadlines (sorting a deep queue by arrival a second time costs as much as the
    pass). DFS-weight has no fallback, so it ages whatever the queue's length."""
    tree, _ = pool(64)
    constants = SchedulerConstants(lpm_fallback_queue_len=2)
    queue = [make_req([i, i + 1], arrival=float(i), rid=f"r{i}") for i in range(3)]
    lpm = SchedulePolicy("lpm", tree, constants)
    lpm.calc_priority(queue)
    assert not lpm._deadlines
    dfs = SchedulePolicy("dfs-weight", tree, constants)
    dfs.calc_priority(queue)
    assert set(dfs._deadlines) == {"r0", "r1", "r2"}
