"""Anti-starvation aging: a cold request among a stream of cache hits is served in bounded time."""

from __future__ import annotations

import pytest
from policy_helpers import cache_tokens, make_req, new_adder, pool

from radixserve.config import SchedulerConstants
from radixserve.policy import SchedulePolicy
from radixserve.types import Req

HOT_PREFIX = list(range(1000, 1064))


def passes_until_admitted(
    policy_name: str, max_skipped_passes: int, *, num_passes: int = 60, arrivals_per_pass: int = 3
) -> int | None:
    """Run admission passes with room for 2 new requests each; ``arrivals_per_pass`` cache-hit
    requests arrive every pass. Returns the pass (1-based) that admits the cold request."""
    tree, alloc = pool(4096)
    cache_tokens(tree, alloc, HOT_PREFIX)
    constants = SchedulerConstants(max_skipped_passes=max_skipped_passes)
    policy = SchedulePolicy(policy_name, tree, constants)
    cold = make_req(range(5000, 5040), arrival=0.0, rid="cold")
    waiting: list[Req] = [cold]
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


def test_fcfs_needs_no_aging() -> None:
    assert passes_until_admitted("fcfs", max_skipped_passes=0) == 1
