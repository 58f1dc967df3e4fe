from __future__ import annotations

import random

import pytest
from policy_helpers import cache_tokens, make_req, pool

from radixserve.config import SchedulerConstants
from radixserve.policy import SchedulePolicy
from radixserve.radix import NoPrefixCache
from radixserve.types import Req

# SGLang's orders: without radixserve's aging, which puts a request that found nobody waiting
# before it first (test_aging.py)
SGLANG = SchedulerConstants().without_aging()


def rids(queue: list[Req]) -> list[str]:
    return [r.rid for r in queue]


def tail(start: int, n: int = 4) -> list[int]:
    return list(range(start, start + n))


def test_unknown_policy_is_rejected() -> None:
    tree, _ = pool(16)
    with pytest.raises(ValueError, match="unknown schedule policy"):
        SchedulePolicy("sjf", tree)


def test_fcfs_orders_by_arrival_and_computes_no_match() -> None:
    tree, _ = pool(16)
    queue = [make_req([1, 2], arrival=t, rid=f"t{t}") for t in (2.0, 0.0, 1.0)]
    assert SchedulePolicy("fcfs", tree).calc_priority(queue).matches == {}
    assert rids(queue) == ["t0.0", "t1.0", "t2.0"]
    assert all(r.prefix_indices is None for r in queue)


def test_lof_longest_output_first_ties_keep_queue_order() -> None:
    tree, _ = pool(16)
    queue = [make_req([1], max_new=n, rid=rid) for n, rid in ((10, "a"), (50, "b"), (10, "c"))]
    assert SchedulePolicy("lof", tree).calc_priority(queue).matches == {}
    assert rids(queue) == ["b", "a", "c"]


def test_random_is_seeded() -> None:
    tree, _ = pool(16)
    base = [make_req([i], rid=f"q{i}") for i in range(20)]
    orders = []
    for seed in (3, 3, 4):
        queue = list(base)
        SchedulePolicy("random", tree, seed=seed).calc_priority(queue)
        orders.append(rids(queue))
    assert orders[0] == orders[1]
    assert orders[0] != orders[2]
    assert sorted(orders[0]) == sorted(rids(base))


def test_lpm_seed_example_longest_prefix_first() -> None:
    """SGLang's ``_sort_by_longest_prefix``: sort by -len(prefix_indices)."""
    tree, alloc = pool(256)
    shared = tail(1000, 40)
    cache_tokens(tree, alloc, shared)
    queue = [
        make_req(tail(5000, 10), rid="hit0"),
        make_req(shared[:10] + tail(6000), rid="hit10"),
        make_req(shared + tail(7000), rid="hit40"),
        make_req(shared[:25] + tail(8000), rid="hit25"),
    ]
    assert set(
        (ordering := SchedulePolicy("lpm", tree, SGLANG).calc_priority(queue)).matches
    ) == set(queue)
    assert rids(queue) == ["hit40", "hit25", "hit10", "hit0"]
    assert [len(ordering.matches[r].indices) for r in queue] == [40, 25, 10, 0]


def test_dfs_weight_seed_example() -> None:
    """SGLang's DFS-weight: root -> [A] (R1, R2, R3) and [B] (R4); DFS gives R1, R2, R3, R4."""
    tree, alloc = pool(256)
    a, b = tail(100, 16), tail(400, 16)
    cache_tokens(tree, alloc, a)
    cache_tokens(tree, alloc, b)
    queue = [make_req(b + tail(900), rid="R4")] + [
        make_req(a + tail(900 + 10 * i), rid=f"R{i}") for i in (1, 2, 3)
    ]
    ordering = SchedulePolicy("dfs-weight", tree, SGLANG).calc_priority(queue)
    assert set(ordering.matches) == set(queue)
    assert rids(queue) == ["R1", "R2", "R3", "R4"]


def test_dfs_weight_visits_heavier_children_first_and_subtrees_before_their_node() -> None:
    tree, alloc = pool(256)
    a, b = tail(100, 16), tail(400, 16)
    cache_tokens(tree, alloc, a + tail(200, 8))  # A then x
    cache_tokens(tree, alloc, a + tail(300, 8))  # A then y: splits into A -> {x, y}
    cache_tokens(tree, alloc, b)
    queue = [
        make_req(tail(5000), rid="cold"),
        make_req(b + tail(900), rid="B1"),
        make_req(a + tail(900), rid="A"),
        make_req(a + tail(300, 8) + tail(900), rid="y"),
        make_req(a + tail(200, 8) + tail(900), rid="x"),
        make_req(b + tail(910), rid="B2"),
        make_req(b + tail(920), rid="B3"),
        make_req(b + tail(930), rid="B4"),
    ]
    SchedulePolicy("dfs-weight", tree, SGLANG).calc_priority(queue)
    # B (weight 4) before A (weight 3); in A, x and y (weight 1 each, insertion order) before
    # A's own request; the cold request (at the root) last.
    assert rids(queue) == ["B1", "B2", "B3", "B4", "x", "y", "A", "cold"]


@pytest.mark.parametrize(("real_match", "deprioritized"), [(31, True), (32, True), (33, False)])
def test_in_batch_check_threshold(real_match: int, deprioritized: bool) -> None:
    """Only a request whose real match is <= 32 is checked against the in-batch tree."""
    tree, alloc = pool(256)
    shared = tail(1000, 40)
    cache_tokens(tree, alloc, shared[:real_match])
    first = make_req(shared + tail(7000), rid="first")
    second = make_req(shared + tail(8000), rid="second")
    cold = make_req(tail(9000, 10), rid="cold")
    queue = [first, second, cold]
    SchedulePolicy("lpm", tree).calc_priority(queue)
    expected = ["first", "cold", "second"] if deprioritized else ["first", "second", "cold"]
    assert rids(queue) == expected


@pytest.mark.parametrize(("in_batch_match", "deprioritized"), [(31, False), (32, True), (33, True)])
def test_in_batch_deprioritize_threshold(in_batch_match: int, deprioritized: bool) -> None:
    """A request whose match in the simulated tree is >= 32 goes to the back this pass."""
    tree, alloc = pool(256)
    total_before = tree.total_size()
    shared = tail(1000, in_batch_match)
    queue = [
        make_req(shared + tail(7000, 10), rid="first"),
        make_req(shared + tail(8000, 10), rid="second"),
        make_req(tail(9000, 10), rid="third"),
    ]
    policy = SchedulePolicy("lpm", tree)
    policy.calc_priority(queue)
    expected = ["first", "third", "second"] if deprioritized else ["first", "second", "third"]
    assert rids(queue) == expected
    assert tree.total_size() == total_before  # the real cache is never written
    # the next pass starts from an empty simulated tree: order restored by arrival in the queue
    queue.sort(key=lambda r: r.rid)
    policy.calc_priority(queue)
    assert rids(queue)[0] == "first"


def test_lpm_falls_back_to_fcfs_above_128_waiting() -> None:
    tree, alloc = pool(1024)
    shared = tail(1000, 64)
    cache_tokens(tree, alloc, shared)
    rng = random.Random(0)

    def queue_of(n: int) -> list[Req]:
        reqs = [
            make_req(shared[: (i * 7) % 64] + tail(10_000 + 10 * i), arrival=float(i), rid=f"q{i}")
            for i in range(n)
        ]
        rng.shuffle(reqs)
        return reqs

    policy = SchedulePolicy("lpm", tree, SGLANG)
    long_queue = queue_of(129)
    assert policy.calc_priority(long_queue).matches == {}
    assert [r.arrival_time for r in long_queue] == [float(i) for i in range(129)]

    short_queue = queue_of(128)
    assert set((ordering := policy.calc_priority(short_queue)).matches) == set(short_queue)
    lens = {r: len(m.indices) for r, m in ordering.matches.items()}
    assert lens[short_queue[0]] == max(lens.values())


@pytest.mark.parametrize("policy_name", ["lpm", "dfs-weight"])
def test_cache_aware_policies_act_as_fcfs_without_a_tree(policy_name: str) -> None:
    policy = SchedulePolicy(policy_name, NoPrefixCache())
    assert policy.policy == "fcfs"
    queue = [make_req([1, 2], arrival=t, rid=f"t{t}") for t in (1.0, 0.0)]
    assert policy.calc_priority(queue).matches == {}
    assert rids(queue) == ["t0.0", "t1.0"]


@pytest.mark.parametrize(
    ("low_values_first", "expected"),
    [(False, ["b", "c", "a", "d"]), (True, ["d", "a", "b", "c"])],
)
def test_priority_direction_then_arrival(low_values_first: bool, expected: list[str]) -> None:
    tree, _ = pool(16)
    queue = [
        make_req([1], priority=p, arrival=t, rid=rid)
        for p, t, rid in ((5, 2.0, "c"), (1, 0.0, "a"), (0, 3.0, "d"), (5, 1.0, "b"))
    ]
    policy = SchedulePolicy(
        "fcfs",
        tree,
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=low_values_first,
    )
    policy.calc_priority(queue)
    assert rids(queue) == expected


def test_priority_comes_before_the_policy_order() -> None:
    tree, alloc = pool(256)
    shared = tail(1000, 40)
    cache_tokens(tree, alloc, shared)
    queue = [
        make_req(shared + tail(7000), priority=0, rid="hit-low"),
        make_req(tail(8000, 10), priority=3, rid="cold-high"),
        make_req(shared[:20] + tail(9000), priority=3, rid="warm-high"),
    ]
    SchedulePolicy("lpm", tree, enable_priority_scheduling=True).calc_priority(queue)
    assert rids(queue) == ["warm-high", "cold-high", "hit-low"]


def test_aged_requests_go_first_fcfs_among_them() -> None:
    tree, alloc = pool(256)
    shared = tail(1000, 40)
    cache_tokens(tree, alloc, shared)
    constants = SchedulerConstants(max_skipped_passes=4, aging_work_factor=0.0)
    hit = make_req(shared + tail(7000), arrival=5.0, rid="hit")
    young = make_req(tail(8000, 10), arrival=2.0, rid="aged-young")
    old = make_req(tail(9000, 10), arrival=1.0, rid="aged-old")
    young.skipped_passes, old.skipped_passes = 4, 7
    queue = [hit, young, old]
    SchedulePolicy("lpm", tree, constants).calc_priority(queue)
    assert rids(queue) == ["aged-old", "aged-young", "hit"]
    young.skipped_passes = old.skipped_passes = 3  # below the bound: plain LPM
    SchedulePolicy("lpm", tree, constants).calc_priority(queue)
    assert rids(queue)[0] == "hit"


def test_on_pass_done_counts_overtakes_only() -> None:
    tree, _ = pool(16)
    policy = SchedulePolicy("lpm", tree)
    early, late = make_req([1], arrival=1.0), make_req([2], arrival=3.0)
    admitted = make_req([3], arrival=2.0)
    admitted.skipped_passes = 5
    policy.on_pass_done([early, late], [admitted])
    assert (early.skipped_passes, late.skipped_passes, admitted.skipped_passes) == (1, 0, 0)
    policy.on_pass_done([early, late], [])
    assert (early.skipped_passes, late.skipped_passes) == (1, 0)
