"""Property: whatever the queue, the PrefillAdder never admits more than its budget holds."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from policy_helpers import cache_tokens, make_req, new_adder, pool, running_req

from radixserve.policy import match_req_prefix

tokens = st.lists(st.integers(0, 3), min_size=1, max_size=40)


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    page_size = draw(st.sampled_from([1, 4]))
    return {
        "page_size": page_size,
        "capacity": draw(st.integers(16, 96)) * page_size,
        "cached": draw(st.lists(tokens, max_size=3)),
        "running": draw(
            st.lists(
                st.tuples(st.integers(1, 20), st.integers(0, 5), st.integers(1, 50)), max_size=3
            )
        ),
        "waiting": draw(
            st.lists(
                st.tuples(tokens, st.integers(0, 30), st.booleans(), st.integers(0, 40)),
                min_size=1,
                max_size=8,
            )
        ),
        "ratio": draw(st.sampled_from([0.1, 0.5, 1.0])),
        "max_prefill": draw(st.integers(1, 200)),
        "chunk": draw(st.one_of(st.none(), st.integers(page_size, 48))),
        "max_new_reqs": draw(st.integers(1, 6)),
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_adder_never_over_commits(s: dict) -> None:
    ps = s["page_size"]
    tree, alloc = pool(s["capacity"], ps)
    for seq in s["cached"]:
        aligned = seq[: len(seq) // ps * ps]
        if aligned and alloc.available_size() >= len(aligned):
            cache_tokens(tree, alloc, aligned)
    running = []
    for i, (prompt_len, output_len, max_new) in enumerate(s["running"]):
        need = -(-(prompt_len + output_len - 1) // ps) * ps
        if prompt_len + output_len > 1 and alloc.available_size() >= need + ps:
            running.append(
                running_req(
                    alloc, prompt_len, output_len, max_new=max_new, first_token=100 * (i + 1)
                )
            )
    evictable_before = tree.evictable_size()
    adder = new_adder(
        tree,
        alloc,
        running,
        ratio=s["ratio"],
        max_prefill=s["max_prefill"],
        chunk=s["chunk"],
        max_new_reqs=s["max_new_reqs"],
    )
    initial_total = adder.rem_total_tokens

    for i, (seq, max_new, ignore_eos, reuse) in enumerate(s["waiting"]):
        base = s["cached"][i % len(s["cached"])][:reuse] if s["cached"] else []
        req = make_req(base + seq, max_new=max_new, ignore_eos=ignore_eos)
        adder.add_one_req(req, match=match_req_prefix(req, tree))

    plan = adder.result
    admitted = [a.req for a in plan.admitted]
    budget = adder.budget
    event(f"admitted {min(len(admitted), 3)}{'+' if len(admitted) > 3 else ''}")
    event(f"chunked: {adder.new_chunked_req is not None}")
    event(f"a cache hit admitted: {any(a.prefix_len for a in plan.admitted)}")
    charged = sum(
        budget.ceil_pages(a.extend_len)
        + (0 if a.req is adder.new_chunked_req else budget.new_tokens(a.req))
        for a in plan.admitted
    )
    inputs = sum(budget.ceil_pages(a.extend_len) for a in plan.admitted)
    assert charged <= max(initial_total, 0)
    # ... and counting the evictable memory that the kept locks took away:
    assert not admitted or adder.rem_total_tokens > 0
    assert inputs <= alloc.available_size() + tree.evictable_size()  # allocatable right now
    assert len(admitted) <= s["max_new_reqs"]
    for a in plan.admitted:
        assert a.match is not None
        remaining = a.req.seq_len - a.prefix_len
        if a.req is adder.new_chunked_req:
            assert 0 < a.extend_len < remaining and a.extend_len % ps == 0
        else:
            assert a.extend_len == remaining
        assert a.match.last_node is tree.root or a.match.last_node.lock_ref >= 1
    tree.check_integrity()
    for a in plan.admitted:  # every lock the adder kept is one per admitted request
        tree.dec_lock_ref(a.match.last_node)  # type: ignore[union-attr]
    assert tree.evictable_size() == evictable_before and tree.protected_size() == 0
    tree.check_integrity()
