"""Priority preemption: the adder decides victims and credits its budget; it frees nothing."""

from __future__ import annotations

import pytest
from policy_helpers import make_req, new_adder, pool, running_req

from radixserve.memory_pool import TokenToKVPoolAllocator
from radixserve.policy import AddReqResult, PrefillAdder
from radixserve.radix import RadixCache
from radixserve.types import Req

# Each runner holds 200 KV slots of its own and reserves 9 decode tokens (ratio 1.0): preempting
# one credits 209 tokens. Four of them leave 1000 - 800 = 200 free and rem_total = 200 - 36.
CREDIT = 209
REM_TOTAL = 164


def runners(alloc: TokenToKVPoolAllocator, specs: list[tuple[str, int, float]]) -> dict[str, Req]:
    out = {}
    for i, (name, priority, arrival) in enumerate(specs):
        req = running_req(
            alloc,
            190,
            11,
            max_new=20,
            priority=priority,
            arrival=arrival,
            first_token=10_000 * (i + 1),
        )
        req.rid = name
        out[name] = req
    return out


def setup(
    priority: int, prompt_len: int, *, low_values_first: bool = False, enabled: bool = True
) -> tuple[RadixCache, PrefillAdder, dict[str, Req], Req]:
    tree, alloc = pool(1000)
    running = runners(
        alloc, [("low-old", 0, 1.0), ("low-new", 0, 2.0), ("mid", 5, 3.0), ("high", 20, 4.0)]
    )
    adder = new_adder(
        tree,
        alloc,
        list(running.values()),
        max_new_reqs=8,
        priority=enabled,
        low_first=low_values_first,
    )
    assert adder.rem_total_tokens == REM_TOTAL
    req = make_req(range(prompt_len - 1, -1, -1), max_new=50, priority=priority, arrival=9.0)
    assert adder.add_one_req(req) is AddReqResult.NO_TOKEN
    return tree, adder, running, req


@pytest.mark.parametrize(
    ("prompt_len", "victims"),
    [(300, ["low-new"]), (500, ["low-new", "low-old"]), (700, ["low-new", "low-old", "mid"])],
)
def test_only_as_many_victims_as_needed_least_urgent_most_recent_first(
    prompt_len: int, victims: list[str]
) -> None:
    _, adder, running, req = setup(16, prompt_len)
    assert adder.preempt_to_schedule(req) is True
    assert [r.rid for r in adder.preempt_list] == victims
    assert adder.rem_total_tokens == REM_TOTAL + CREDIT * len(victims)
    assert adder.add_one_req(req) is not None and req in adder.can_run_list
    assert adder.rem_total_tokens == REM_TOTAL + CREDIT * len(victims) - (prompt_len + 50)


def test_nothing_changes_when_the_outranked_runners_cannot_free_enough() -> None:
    tree, adder, running, req = setup(16, 800)  # needs 4 victims; "high" is not outranked
    before = (adder.rem_total_tokens, adder.budget.free_slots, tree.evictable_size())
    assert adder.preempt_to_schedule(req) is False
    assert adder.preempt_list == []
    assert (adder.rem_total_tokens, adder.budget.free_slots, tree.evictable_size()) == before
    tree.check_integrity()


@pytest.mark.parametrize(("priority", "preempts"), [(15, False), (16, True)])
def test_the_gap_must_exceed_the_threshold(priority: int, preempts: bool) -> None:
    # 700 tokens need three victims, the third being "mid" (priority 5): gap 10 is not enough.
    _, adder, running, req = setup(priority, 700)
    assert adder.preempt_to_schedule(req) is preempts
    assert len(adder.preempt_list) == (3 if preempts else 0)


def test_low_values_first_flips_the_direction() -> None:
    # With small values urgent, "high" (20) is the least urgent runner; -5 outranks it by 25.
    _, adder, running, req = setup(-5, 300, low_values_first=True)
    assert adder.preempt_to_schedule(req) is True
    assert [r.rid for r in adder.preempt_list] == ["high"]


def test_no_preemption_without_priority_scheduling() -> None:
    _, adder, running, req = setup(100, 300, enabled=False)
    assert adder.preempt_to_schedule(req) is False


def test_a_victim_frees_a_running_slot() -> None:
    tree, alloc = pool(1000)
    running = runners(alloc, [("low", 0, 1.0)])
    adder = new_adder(tree, alloc, list(running.values()), max_new_reqs=0, priority=True)
    req = make_req(range(10), max_new=5, priority=50)
    assert adder.add_one_req(req) is AddReqResult.OTHER  # memory is fine, no slot
    assert adder.preempt_to_schedule(req) is True
    assert adder.add_one_req(req) is AddReqResult.OTHER and adder.can_run_list == [req]


def test_an_admitted_request_never_preempts() -> None:
    tree, alloc = pool(1000)
    running = runners(alloc, [("low", 0, 1.0)])
    adder = new_adder(tree, alloc, list(running.values()), max_new_reqs=1, priority=True)
    req = make_req(range(10), max_new=5, priority=50)  # admitted, and takes the last slot
    assert adder.add_one_req(req) is AddReqResult.OTHER and req in adder.can_run_list
    assert adder.preempt_to_schedule(req) is False
    assert adder.preempt_list == []


def test_admit_waiting_preempts_for_the_urgent_request() -> None:
    tree, alloc = pool(1000)
    running = runners(alloc, [("low-old", 0, 1.0), ("low-new", 0, 2.0), ("mid", 5, 3.0)])
    adder = new_adder(tree, alloc, list(running.values()), max_new_reqs=8, priority=True)
    urgent = make_req(range(400), max_new=50, priority=30)  # 450 > 400 free - 27 reserved
    later = make_req(range(1000, 1400), max_new=50, priority=0)  # cannot preempt anyone
    adder.plan([urgent, later])
    assert adder.can_run_list == [urgent]
    assert [r.rid for r in adder.preempt_list] == ["low-new"]
