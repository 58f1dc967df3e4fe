"""The admission loop: in-batch deprioritized requests wait for the next pass."""

from __future__ import annotations

from policy_helpers import make_req, pool

from radixserve.policy import PrefillAdder, SchedulePolicy, admit_waiting


def test_deprioritized_requests_wait_for_the_pass_after_their_prefix_provider() -> None:
    tree, allocator = pool(4096)
    system = list(range(100, 164))
    group = [make_req(system + [i, i + 1], arrival=float(i)) for i in range(3)]
    cold = make_req(list(range(900, 940)), arrival=5.0)
    waiting = [*group, cold]
    policy = SchedulePolicy("lpm", tree)
    prefix_computed = policy.calc_priority(waiting)
    assert policy.deprioritized == {group[1].rid, group[2].rid}
    adder = PrefillAdder(1, tree, allocator, [], 0.7, 16384, None, 8)
    admit_waiting(adder, waiting, prefix_computed, deprioritized=policy.deprioritized)
    assert {r.rid for r in adder.can_run_list} == {group[0].rid, cold.rid}


def test_a_deprioritized_request_still_runs_when_nothing_else_is_admitted() -> None:
    tree, allocator = pool(4096)
    req = make_req(list(range(50)))
    adder = PrefillAdder(1, tree, allocator, [], 0.7, 16384, None, 8)
    admit_waiting(adder, [req], False, deprioritized=frozenset({req.rid}))
    assert adder.can_run_list == [req]
