"""The admission loop: in-batch deprioritized requests wait for the next pass."""

from __future__ import annotations

from policy_helpers import make_req, new_adder, pool

from radixserve.policy import SchedulePolicy


def test_deprioritized_requests_wait_for_the_pass_after_their_prefix_provider() -> None:
    tree, allocator = pool(4096)
    system = list(range(100, 164))
    group = [make_req(system + [i, i + 1], arrival=float(i)) for i in range(3)]
    cold = make_req(list(range(900, 940)), arrival=5.0)
    waiting = [*group, cold]
    policy = SchedulePolicy("lpm", tree)
    ordering = policy.calc_priority(waiting)
    assert ordering.deprioritized == {group[1].rid, group[2].rid}
    adder = new_adder(tree, allocator, ratio=0.7, max_new_reqs=8)
    adder.plan(waiting, ordering.matches, ordering.deprioritized)
    assert {r.rid for r in adder.can_run_list} == {group[0].rid, cold.rid}


def test_a_deprioritized_request_still_runs_when_nothing_else_is_admitted() -> None:
    tree, allocator = pool(4096)
    req = make_req(list(range(50)))
    adder = new_adder(tree, allocator, ratio=0.7, max_new_reqs=8)
    adder.plan([req], deprioritized=frozenset({req.rid}))
    assert adder.can_run_list == [req]
