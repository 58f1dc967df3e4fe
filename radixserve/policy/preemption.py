"""Priority preemption: which running requests may give way to a more urgent waiting one.

Pure functions; ``PrefillAdder.preempt_to_schedule`` applies them to its budget. Nothing here
frees memory: the scheduler frees the victims and puts them back in the waiting queue.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixserve.policy.sort_keys import urgency
from radixserve.types import Req


def victim_order(running_reqs: Iterable[Req], low_values_first: bool) -> list[Req]:
    """Running requests in the order they are preempted: least urgent first, and among equally
    urgent ones the most recently arrived first (it has the least work to lose)."""
    return sorted(
        running_reqs, key=lambda r: (urgency(r.priority, low_values_first), -r.arrival_time)
    )


def outranks(req: Req, victim: Req, threshold: int, low_values_first: bool) -> bool:
    """``req`` may preempt ``victim``: its urgency exceeds the victim's by more than ``threshold``
    (a gap equal to the threshold is not enough)."""
    gap = urgency(req.priority, low_values_first) - urgency(victim.priority, low_values_first)
    return gap > threshold


def freeable_tokens(victim: Req) -> int:
    """KV slots a running request holds outside the tree, which preempting it gives back:
    ``row[prefix_len:kv_len]`` (``Req.kv_len``). Its first ``prefix_len`` slots are shared with
    the tree and stay cached; they become evictable only if no one else locks them, which is
    not counted, so this is a lower bound on what the release adds to free + evictable."""
    return max(victim.kv_len - victim.prefix_len, 0)
