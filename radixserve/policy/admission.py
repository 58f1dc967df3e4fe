"""The admission loop of one scheduling pass: offer the ordered queue to a PrefillAdder."""

from __future__ import annotations

from collections.abc import Sequence

from radixserve.policy.prefill_adder import AddReqResult, PrefillAdder
from radixserve.policy.prefix_match import match_req_prefix
from radixserve.types import Req


def admit_waiting(
    adder: PrefillAdder,
    waiting_queue: Sequence[Req],
    prefix_computed: bool,
    has_chunked_req: bool = False,
    deprioritized: frozenset[str] = frozenset(),
) -> AddReqResult:
    """Offer ``waiting_queue`` (already ordered by ``SchedulePolicy.calc_priority``) in order.

    ``prefix_computed``: what ``calc_priority`` returned; when False each request is matched here
    just before it is offered. A refused request may preempt running ones (priority scheduling);
    the loop stops at the first request that is refused and cannot preempt, so no request
    overtakes a refused one. Returns the last ``AddReqResult``. Admitted requests are in
    ``adder.can_run_list``; the caller removes them from the queue.

    ``deprioritized`` (``SchedulePolicy.deprioritized``): once something is admitted, these wait
    for the next pass, when the prefix they share with an admitted request is cached (seed 004
    section 4: "schedule only A; B and C reuse its system prompt after A's prefill"). SGLang
    only moves them to the back, so with room they join the same batch and recompute it.
    """
    result = AddReqResult.CONTINUE
    for req in waiting_queue:
        if req.rid in deprioritized and adder.can_run_list:
            continue
        if not prefix_computed:
            match_req_prefix(req, adder.tree_cache)
        num_admitted = len(adder.can_run_list)
        result = adder.add_one_req(req, has_chunked_req)
        if len(adder.can_run_list) > num_admitted:
            continue
        if not adder.preempt_to_schedule(req, adder.running_reqs, has_chunked_req):
            break
        result = adder.add_one_req(req, has_chunked_req)
        assert len(adder.can_run_list) > num_admitted, "preemption promised room for the request"
    return result
