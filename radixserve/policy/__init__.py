"""Scheduling policy: the order of the waiting queue, admission to prefill, preemption choice.

One pass of the scheduler, in data-flow order (seed 004; DESIGN.md section 5)::

    prefix_computed = policy.calc_priority(waiting_queue)        # order (and match) the queue
    adder = PrefillAdder(page_size, tree, allocator, running_reqs, new_token_ratio, ...)
    prev_chunked = chunked_req
    if prev_chunked is not None:
        adder.add_chunked_req(prev_chunked)                        # it continues first
    admit_waiting(adder, waiting_queue, prefix_computed)          # offer, preempt, stop
    chunked_req = adder.new_chunked_req                           # continuing, new, or None
    admitted = [r for r in adder.can_run_list if r is not prev_chunked]
    waiting_queue = [r for r in waiting_queue if r not in admitted]
    policy.on_pass_done(waiting_queue, admitted)                  # aging, every pass
    # then free adder.preempt_list (they keep output_ids; back to waiting), allocate and run
    # adder.can_run_list; each admitted request holds a lock on req.last_node until released

Nothing here allocates, frees or evicts; the policy only matches against the tree and the adder
only locks nodes. The tree never sees a ``Req``: requests' fields are passed to it.
"""

from radixserve.policy.admission import admit_waiting
from radixserve.policy.prefill_adder import PrefillAdder
from radixserve.policy.prefill_budget import AddReqResult, PrefillBudget
from radixserve.policy.prefix_match import match_key, match_req_prefix
from radixserve.policy.schedule_policy import SchedulePolicy
from radixserve.policy.sort_keys import SORT_KEYS, urgency

__all__ = [
    "SORT_KEYS",
    "AddReqResult",
    "PrefillAdder",
    "PrefillBudget",
    "SchedulePolicy",
    "admit_waiting",
    "match_key",
    "match_req_prefix",
    "urgency",
]
