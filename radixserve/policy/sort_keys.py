"""Waiting-queue orderings as pure sort-key functions, one per policy, in a registry.

A key maps a request and the facts of this pass (:class:`PassFacts`) to something that sorts
ascending: the request with the smallest key is admitted first. Sorting is stable, so equal keys
keep the queue order. ``SchedulePolicy`` composes a policy key with :func:`urgency_key` (priority
scheduling) and with aging; nothing here mutates a request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixserve.types import Req

FCFS = "fcfs"
LOF = "lof"
RANDOM = "random"
LPM = "lpm"
DFS_WEIGHT = "dfs-weight"
HRRN = "hrrn"
# LPM while the waiting queue's uncached tokens exceed what the pool can give, FCFS otherwise
ADAPTIVE = "adaptive"
CACHE_AWARE_POLICIES = frozenset({LPM, DFS_WEIGHT, HRRN, ADAPTIVE})


@dataclass(frozen=True, slots=True)
class PassFacts:
    """What one ``calc_priority`` pass learned, keyed by ``rid``.

    ``deprioritized``: requests pushed to the back by the in-batch prefix check (LPM, HRRN).
    ``prefix_lens``: each request's cached prefix length this pass (LPM, HRRN).
    ``processed_tokens``: prompt tokens the scheduler has computed so far (HRRN's clock).
    ``dfs_rank``: position of each request in the DFS-weight traversal.
    ``random_rank``: a seeded random number per request (RANDOM).
    """

    deprioritized: frozenset[str] = frozenset()
    prefix_lens: Mapping[str, int] = field(default_factory=dict)
    dfs_rank: Mapping[str, int] = field(default_factory=dict)
    random_rank: Mapping[str, float] = field(default_factory=dict)
    processed_tokens: int = 0


SortKey = Callable[[Req, PassFacts], Any]


def fcfs_key(req: Req, facts: PassFacts) -> float:
    """First come, first served: earlier ``arrival_time`` first. A preempted or retracted request
    keeps its arrival time, so it returns to its old place near the front."""
    return req.arrival_time


def lof_key(req: Req, facts: PassFacts) -> float:
    """Longest output first: larger ``max_new_tokens`` first (SGLang's LOF)."""
    return -req.sampling_params.max_new_tokens


def random_key(req: Req, facts: PassFacts) -> float:
    return facts.random_rank[req.rid]


def lpm_key(req: Req, facts: PassFacts) -> float:
    """Longest prefix match first; in-batch deprioritized requests last (SGLang's LPM)."""
    return math.inf if req.rid in facts.deprioritized else -facts.prefix_lens[req.rid]


def dfs_weight_key(req: Req, facts: PassFacts) -> float:
    return facts.dfs_rank[req.rid]


def hrrn_key(req: Req, facts: PassFacts) -> tuple[float, str]:
    """Highest response ratio next (SGLang's HRRN): ``waited / uncached``, largest first, where
    ``waited`` is the prompt tokens the scheduler computed since the request arrived (its age in
    work done, not in seconds) and ``uncached`` the tokens it still has to compute. A request
    with nothing to compute goes first; in-batch deprioritized ones last; ties by ``rid``.
    A short request is soon first; a long one's ratio grows as it waits, so it is never starved."""
    if req.rid in facts.deprioritized:
        return (math.inf, req.rid)
    uncached = len(req.fill_ids) - facts.prefix_lens[req.rid]
    if uncached <= 0:
        return (-math.inf, req.rid)
    waited = facts.processed_tokens - req.arrival_processed_tokens
    return (-waited / uncached, req.rid)


SORT_KEYS: dict[str, SortKey] = {
    FCFS: fcfs_key,
    LOF: lof_key,
    RANDOM: random_key,
    LPM: lpm_key,
    DFS_WEIGHT: dfs_weight_key,
    HRRN: hrrn_key,
    ADAPTIVE: lpm_key,  # when it orders by prefix (schedule_policy.py decides per pass)
}


def urgency(priority: int, low_values_first: bool) -> int:
    """How urgent a priority value is: larger is more urgent.

    SGLang's default direction: a larger ``priority`` value is more urgent. With
    ``low_values_first`` (``--schedule-low-priority-values-first``) a smaller value is.
    """
    return -priority if low_values_first else priority


def urgency_key(req: Req, low_values_first: bool) -> int:
    """Sort key for priority scheduling: the most urgent request sorts first."""
    return -urgency(req.priority, low_values_first)
