"""HRRN, with SGLang's own unit tests for it (``test/srt/test_schedule_policy.py``,
``TestSchedulePolicyHRRN``) ported case for case: the ratio is the prompt tokens processed since
a request arrived over its uncached tokens, largest first."""

from __future__ import annotations

from policy_helpers import cache_tokens, make_req, pool

from radixserve.config import SchedulerConstants
from radixserve.policy import SchedulePolicy
from radixserve.policy.sort_keys import PassFacts, hrrn_key
from radixserve.types import Req


def rids(queue: list[Req]) -> list[str]:
    return [r.rid for r in queue]


def test_calc_priority_hrrn() -> None:
    """SGLang's ``test_calc_priority_hrrn``: every request waited 1000 tokens; the ratios are
    short 1000/1, aged 1000/3, long 1000/10."""
    tree, _ = pool(64)
    short, long = make_req([1], rid="short"), make_req(range(10), rid="long")
    aged = make_req([1, 2, 3], rid="aged")
    queue = [long, aged, short]
    SchedulePolicy("hrrn", tree).calc_priority(queue, processed_tokens=1000)
    assert rids(queue) == ["short", "aged", "long"]


def test_calc_priority_hrrn_aging_overtakes_short() -> None:
    """SGLang's ``test_calc_priority_hrrn_aging_overtakes_short``: a 100-token request that
    waited 100000 tokens (ratio 1000) goes before a 1-token one that just arrived (ratio 0)."""
    tree, _ = pool(256)
    long_old, short_new = make_req(range(100), rid="long_old"), make_req([1], rid="short_new")
    long_old.arrival_processed_tokens, short_new.arrival_processed_tokens = 0, 100_000
    queue = [short_new, long_old]
    SchedulePolicy("hrrn", tree).calc_priority(queue, processed_tokens=100_000)
    assert rids(queue) == ["long_old", "short_new"]


def test_calc_priority_hrrn_cached_length_affects_order() -> None:
    """SGLang's ``test_calc_priority_hrrn_cached_length_affects_order``, on the sort key as
    SGLang calls ``_sort_by_hrrn`` directly: 90 of 100 tokens cached -> ratio 1000/10 first;
    equal ratios by rid."""
    reqs = [make_req(range(100), rid=rid) for rid in ("c", "b", "a")]
    facts = PassFacts(prefix_lens={"a": 90, "b": 0, "c": 0}, processed_tokens=1000)
    reqs.sort(key=lambda r: hrrn_key(r, facts))
    assert rids(reqs) == ["a", "b", "c"]


def test_the_cache_shortens_the_uncached_part_through_calc_priority() -> None:
    """The same with a real tree: the request whose prompt is cached needs 10 tokens, not 100."""
    tree, alloc = pool(512)
    cached = make_req(range(100), rid="z-cached")
    cache_tokens(tree, alloc, list(range(90)))
    cold = make_req(range(1000, 1100), rid="a-cold")
    queue = [cold, cached]
    SchedulePolicy("hrrn", tree).calc_priority(queue, processed_tokens=50)
    assert rids(queue) == ["z-cached", "a-cold"]


def test_nothing_to_compute_goes_first_and_in_batch_duplicates_last() -> None:
    tree, alloc = pool(512)
    shared = list(range(500, 560))
    first, dup = make_req([*shared, 1], rid="first"), make_req([*shared, 2], rid="dup")
    other = make_req(range(2000, 2080), rid="other")
    cache_tokens(tree, alloc, list(range(3000, 3011)))
    done = make_req(range(3000, 3011), rid="done")  # all but its last token cached
    queue = [first, dup, other, done]
    ordering = SchedulePolicy("hrrn", tree).calc_priority(queue, processed_tokens=10)
    assert rids(queue)[0] == "done" and rids(queue)[-1] == "dup"
    assert ordering.deprioritized == frozenset({"dup"})


def test_a_long_queue_falls_back_to_fcfs_like_lpm() -> None:
    tree, _ = pool(16)
    constants = SchedulerConstants(lpm_fallback_queue_len=3)
    queue = [make_req([t] * (1 + t), arrival=float(-t), rid=f"r{t}") for t in range(4)]
    SchedulePolicy("hrrn", tree, constants).calc_priority(queue, processed_tokens=100)
    assert rids(queue) == ["r3", "r2", "r1", "r0"]  # by arrival, not by ratio
