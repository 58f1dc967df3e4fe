"""Property: whatever the queue, the PrefillAdder never admits more than its budget holds."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from policy_helpers import cache_tokens, make_req, pool, running_req

from radixserve.policy import PrefillAdder, match_req_prefix

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
    adder = PrefillAdder(
        ps, tree, alloc, running, s["ratio"], s["max_prefill"], s["chunk"], s["max_new_reqs"]
    )
    initial_total = adder.rem_total_tokens

    for i, (seq, max_new, ignore_eos, reuse) in enumerate(s["waiting"]):
        base = s["cached"][i % len(s["cached"])][:reuse] if s["cached"] else []
        req = make_req(base + seq, max_new=max_new, ignore_eos=ignore_eos)
        match_req_prefix(req, tree)
        adder.add_one_req(req)

    admitted = adder.can_run_list
    budget = adder.budget
    event(f"admitted {min(len(admitted), 3)}{'+' if len(admitted) > 3 else ''}")
    event(f"chunked: {adder.new_chunked_req is not None}")
    event(f"a cache hit admitted: {any(r.prefix_len for r in admitted)}")
    charged = sum(
        budget.ceil_pages(r.extend_len)
        + (0 if r is adder.new_chunked_req else budget.new_tokens(r))
        for r in admitted
    )
    inputs = sum(budget.ceil_pages(r.extend_len) for r in admitted)
    assert charged <= max(initial_total, 0)
    # ... and counting the evictable memory that the kept locks took away:
    assert not admitted or adder.rem_total_tokens > 0
    assert inputs <= alloc.available_size() + tree.evictable_size()  # allocatable right now
    assert len(admitted) <= s["max_new_reqs"]
    for req in admitted:
        remaining = req.seq_len - req.prefix_len
        if req is adder.new_chunked_req:
            assert 0 < req.extend_len < remaining and req.extend_len % ps == 0
        else:
            assert req.extend_len == remaining
        assert req.last_node is tree.root or req.last_node.lock_ref >= 1
    tree.check_integrity()
    for req in admitted:  # every lock the adder kept is one per admitted request
        tree.dec_lock_ref(req.last_node)
    assert tree.evictable_size() == evictable_before and tree.protected_size() == 0
    tree.check_integrity()
