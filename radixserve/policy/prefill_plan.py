"""What one admission pass decides, as data: the PrefillAdder returns it, the KVManager commits.

Ownership of tree locks across the hand-over (``Admission.match``)::

    adder.add_one_req          locks match.last_node (tentative: the plan holds it)
    KVManager.alloc_extend     adopts the match into the request (req.last_node, prefix_indices)
    KVManager.cancel           or, when the plan is not run, drops the lock

The continuing chunked request has ``match is None``: it keeps the lock it already holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.radix.base import MatchResult
from radixserve.types import Req


@dataclass(frozen=True, slots=True)
class Admission:
    """One request of the prefill batch: compute ``fill_ids[start : start + extend_len]``, where
    ``start`` is the matched prefix (``match``) or, for the continuing chunked request, what its
    earlier chunks computed."""

    req: Req
    match: MatchResult | None
    extend_len: int

    @property
    def prefix_len(self) -> int:
        """Tokens the request reuses from the tree, in the pool or loaded back from the tier (0
        for the continuing chunked request, whose own chunks already sit in its row)."""
        return 0 if self.match is None else self.match.cached_len

    @property
    def load_len(self) -> int:
        """Tokens loaded back from the KV tier before the forward (slots, not compute)."""
        return 0 if self.match is None else self.match.tier_len


@dataclass(slots=True)
class PrefillPlan:
    """``admitted``: the batch, in order (the continuing chunked request first).
    ``chunked``: the request that continues with another chunk next pass, if any (it is in
    ``admitted`` too). ``to_preempt``: running requests to send back before the batch runs
    (the budget already counted their memory as free)."""

    admitted: list[Admission] = field(default_factory=list)
    chunked: Req | None = None
    to_preempt: list[Req] = field(default_factory=list)

    @property
    def reqs(self) -> list[Req]:
        return [a.req for a in self.admitted]

    def new_admissions(self) -> list[Admission]:
        """Admissions that hold a tentative lock (all but the continuing chunked request)."""
        return [a for a in self.admitted if a.match is not None]
