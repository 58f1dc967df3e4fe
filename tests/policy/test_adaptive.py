"""``adaptive``: LPM while the waiting queue's uncached tokens exceed what the pool can give
(free plus evictable), FCFS while they fit (where a cache-aware order saves nothing)."""

from __future__ import annotations

from policy_helpers import cache_tokens, make_req, pool

from radixserve.config import SchedulerConstants
from radixserve.policy import SchedulePolicy
from radixserve.types import Req


def rids(queue: list[Req]) -> list[str]:
    return [r.rid for r in queue]


def queue_with_a_cached_prefix() -> tuple[list[Req], object]:
    tree, alloc = pool(1024)
    cache_tokens(tree, alloc, list(range(100)))
    cold = make_req(range(5000, 5040), arrival=0.0, rid="cold")  # arrived first, no match
    hot = make_req([*range(100), 7], arrival=1.0, rid="hot")  # 100 tokens cached
    return [cold, hot], tree


def test_a_queue_that_fits_in_the_pool_is_served_in_arrival_order() -> None:
    queue, tree = queue_with_a_cached_prefix()
    ordering = SchedulePolicy("adaptive", tree).calc_priority(queue, available_tokens=1000)
    assert rids(queue) == ["cold", "hot"]
    assert {r.rid: m.cached_len for r, m in ordering.matches.items()} == {"cold": 0, "hot": 100}


def test_a_queue_that_does_not_fit_is_ordered_by_its_matches() -> None:
    queue, tree = queue_with_a_cached_prefix()
    # the queue computes 40 + 1 tokens (hot's last one): with 40 available it would evict
    # (without aging, which would put "cold", found with nobody before it, first anyway)
    sglang = SchedulerConstants().without_aging()
    SchedulePolicy("adaptive", tree, sglang).calc_priority(queue, available_tokens=40)
    assert rids(queue) == ["hot", "cold"]
    queue, tree = queue_with_a_cached_prefix()
    SchedulePolicy("adaptive", tree, sglang).calc_priority(queue, available_tokens=41)
    assert rids(queue) == ["cold", "hot"]


def test_a_long_queue_falls_back_to_fcfs_like_lpm() -> None:
    queue, tree = queue_with_a_cached_prefix()
    constants = SchedulerConstants(lpm_fallback_queue_len=1)
    SchedulePolicy("adaptive", tree, constants).calc_priority(queue, available_tokens=0)
    assert rids(queue) == ["cold", "hot"]
