"""Scheduling policy: the order of the waiting queue, admission to prefill, preemption choice.

One pass of the scheduler decides, then commits (docs/design.md, "Scheduling")::

    ordering = policy.calc_priority(waiting_queue)               # order; matches as data
    plan = PrefillAdder(config.admission, kv, running, ratio, max_new_reqs).plan(
        waiting_queue, ordering.matches, ordering.deprioritized, chunked_req)
    kv.alloc_extend(plan.admitted)                                # the KVManager commits

Nothing here allocates, frees or evicts, or writes a KV field of a request: the policy only
matches against the tree, and the adder only takes the tentative locks that its plan carries.
The tree never sees a ``Req``: requests' fields are passed to it.
"""

from radixserve.policy.prefill_adder import PrefillAdder
from radixserve.policy.prefill_budget import AddReqResult, KVView, PrefillBudget
from radixserve.policy.prefill_plan import Admission, PrefillPlan
from radixserve.policy.prefix_match import match_key, match_req_prefix
from radixserve.policy.schedule_policy import Ordering, SchedulePolicy
from radixserve.policy.sort_keys import SORT_KEYS, urgency

__all__ = [
    "SORT_KEYS",
    "AddReqResult",
    "Admission",
    "KVView",
    "Ordering",
    "PrefillAdder",
    "PrefillBudget",
    "PrefillPlan",
    "SchedulePolicy",
    "match_key",
    "match_req_prefix",
    "urgency",
]
