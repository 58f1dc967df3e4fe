"""SchedulePolicy: the order in which waiting requests are offered to the PrefillAdder."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixserve.config import EngineConfig, SchedulerConstants
from radixserve.policy.dfs_weight import dfs_weight_rank
from radixserve.policy.prefix_match import match_key, match_req_prefix
from radixserve.policy.sort_keys import (
    ADAPTIVE,
    CACHE_AWARE_POLICIES,
    DFS_WEIGHT,
    FCFS,
    HRRN,
    LPM,
    RANDOM,
    SORT_KEYS,
    PassFacts,
    urgency_key,
)
from radixserve.radix.base import MatchResult, PrefixCache
from radixserve.radix.radix_cache import RadixCache
from radixserve.types import Req


@dataclass(frozen=True, slots=True)
class Ordering:
    """What ordering the queue learned, for the admission that follows in the same pass.

    ``matches``: every request's match against the tree when a cache-aware policy ran (empty
    otherwise: the ``PrefillAdder`` matches each request it offers). ``deprioritized``: rids the
    in-batch check pushed back; their prefix comes from an earlier request of the same pass, so
    admission defers them to the next pass.
    """

    matches: dict[Req, MatchResult] = field(default_factory=dict)
    deprioritized: frozenset[str] = frozenset()


class SchedulePolicy:
    """Orders the waiting queue once per scheduling pass (SGLang's ``SchedulePolicy``;
    docs/design.md, "Scheduling").

    Policies: ``fcfs`` (default: by arrival time), ``lof`` (largest ``max_new_tokens`` first),
    ``random`` (seeded), and the cache-aware ``lpm`` (longest cached prefix first),
    ``dfs-weight`` (requests of the most requested radix branch together), ``hrrn`` (highest
    response ratio: prompt tokens computed since it arrived over its uncached tokens,
    ``sort_keys.hrrn_key``) and ``adaptive`` (LPM for a pass in which the queue's uncached tokens
    exceed what the pool can give, FCFS otherwise: ``_adaptive``). With a disabled tree
    (``NoPrefixCache``) a cache-aware policy acts as FCFS. LPM, HRRN and adaptive fall back to
    FCFS for a pass in which more than ``constants.lpm_fallback_queue_len`` (128) requests wait.

    In-batch prefix deprioritization (LPM): walking the queue in its current order, a request
    whose real match is at most ``in_batch_prefix_caching_check_threshold`` (32) tokens is
    matched against a simulated tree (never the real cache), rebuilt every pass. If that match is
    at least ``in_batch_prefix_caching_deprioritize_threshold`` (32) tokens, the request goes to
    the back for this pass: an earlier one will cache the shared prefix first. Otherwise all its
    tokens are inserted into the simulated tree.

    Priority scheduling (``enable_priority_scheduling``): priority is the first sort key, the
    policy's order the second. Direction: a larger ``priority`` value is more urgent (SGLang's
    default); with ``schedule_low_priority_values_first`` a smaller value is.

    Anti-starvation aging (beyond SGLang, for ``lpm``, ``dfs-weight`` and ``adaptive``'s LPM
    passes), two kinds; an aged request sorts before every non-aged request of its priority
    class, FCFS among aged ones:

    - By admissions (``constants.aging_work_factor`` = F, the default: 2): when a request is
      first seen waiting behind N requests that arrived before it, FCFS would admit it after N
      admissions; it is aged once N x F requests have been admitted since. It may be overtaken,
      but only by F - 1 times the queue it found; since a cache-aware order admits faster than
      FCFS, F = 2 keeps 98% of LPM's throughput gain under pressure and bounds the wait of what
      it passes over (``benchmarks/README.md``, "Schedule policies").
    - By passes (``constants.max_skipped_passes`` = B > 0; off by default): ``on_pass_done``
      counts in ``req.skipped_passes`` the passes in which a later-arriving request was
      admitted while ``req`` kept waiting; a request that reached B is aged. Under pressure a
      pass admits many requests, so the bound is loose in time, and where it binds it costs
      throughput (``benchmarks/README.md``, "Schedule policies", measures B = 8).

    ``constants.without_aging()`` turns both off: SGLang's LPM and DFS-weight.
    """

    @classmethod
    def from_engine_config(cls, config: EngineConfig, tree_cache: PrefixCache) -> SchedulePolicy:
        admission = config.admission
        return cls(
            admission.schedule_policy,
            tree_cache,
            admission.constants,
            enable_priority_scheduling=admission.enable_priority_scheduling,
            schedule_low_priority_values_first=admission.schedule_low_priority_values_first,
            seed=config.random_seed,
        )

    def __init__(
        self,
        policy: str,
        tree_cache: PrefixCache,
        constants: SchedulerConstants | None = None,
        enable_priority_scheduling: bool = False,
        schedule_low_priority_values_first: bool = False,
        seed: int = 0,
    ) -> None:
        if policy not in SORT_KEYS:
            raise ValueError(
                f"unknown schedule policy {policy!r}; expected one of {list(SORT_KEYS)}"
            )
        self.configured_policy = policy
        self.policy = FCFS if policy in CACHE_AWARE_POLICIES and tree_cache.is_disabled else policy
        self.tree_cache = tree_cache
        self.constants = constants if constants is not None else SchedulerConstants()
        self.enable_priority_scheduling = enable_priority_scheduling
        self.schedule_low_priority_values_first = schedule_low_priority_values_first
        self._rng = random.Random(seed)
        self._in_batch_tree = RadixCache.create_simulated(tree_cache.page_size)
        self._deadlines: dict[str, float] = {}  # aging by admissions: rid -> when it ages
        self._num_admitted = 0  # its clock: requests admitted so far

    @property
    def is_aging(self) -> bool:
        """Aging by passes: LPM's and DFS-weight's (HRRN ages by work done, its own way)."""
        aged = self.policy in CACHE_AWARE_POLICIES and self.policy != HRRN
        return aged and self.constants.max_skipped_passes > 0

    def calc_priority(
        self,
        waiting_queue: list[Req],
        processed_tokens: int = 0,
        available_tokens: int | None = None,
    ) -> Ordering:
        """Sort ``waiting_queue`` in place, most favoured first; write nothing to a request.
        ``processed_tokens``: the prompt tokens computed so far (HRRN's clock; SGLang's name).
        ``available_tokens``: free slots plus what evicting the tree would free (``adaptive``).

        A cache-aware policy matches every request against the tree and returns the matches
        (fresh for this pass), so admission does not match them again.
        """
        policy = self._active_policy(waiting_queue)
        # a long queue's FCFS fallback: aging would not change its order, only cost a sort
        fell_back = policy != self.policy
        facts = PassFacts()
        matches: dict[Req, MatchResult] = {}
        if policy == ADAPTIVE:
            policy = self._adaptive(waiting_queue, matches, available_tokens)
        if policy in (LPM, HRRN):
            deprioritized = self._compute_prefix_matches(waiting_queue, matches, True)
            prefix_lens = {r.rid: m.cached_len for r, m in matches.items()}
            facts = PassFacts(
                deprioritized=deprioritized,
                prefix_lens=prefix_lens,
                processed_tokens=processed_tokens,
            )
        elif policy == DFS_WEIGHT:
            self._compute_prefix_matches(waiting_queue, matches, False)
            root = self.tree_cache.root
            facts = PassFacts(dfs_rank=dfs_weight_rank(waiting_queue, matches, root))
        elif policy == RANDOM:
            facts = PassFacts(random_rank={r.rid: self._rng.random() for r in waiting_queue})
        aged = frozenset() if fell_back else self._aged_by_work(waiting_queue)
        waiting_queue.sort(key=self._composite_key(policy, facts, aged))
        return Ordering(matches, facts.deprioritized)

    def on_pass_done(self, still_waiting: Sequence[Req], admitted: Sequence[Req]) -> None:
        """Aging bookkeeping; call once after every admission pass, even one that admitted none.

        ``admitted``: the requests taken from the waiting queue this pass (``can_run_list``;
        the continuing chunked request may be included). ``still_waiting``: the queue left.
        A waiting request that arrived before some admitted one was overtaken:
        ``skipped_passes += 1``. Admitted requests restart at 0.
        """
        self._num_admitted += len(admitted)
        if admitted:
            newest = max(r.arrival_time for r in admitted)
            for req in still_waiting:
                if req.arrival_time < newest:
                    req.skipped_passes += 1
        for req in admitted:
            req.skipped_passes = 0

    # ---- internals -----------------------------------------------------------------------
    def _aged_by_work(self, waiting_queue: Sequence[Req]) -> frozenset[str]:
        """The rids aged by admissions this pass (see the class docstring); the deadlines of
        requests no longer waiting are dropped."""
        factor = self.constants.aging_work_factor
        if factor <= 0 or self.policy not in CACHE_AWARE_POLICIES or self.policy == HRRN:
            return frozenset()
        clock = self._num_admitted
        deadlines: dict[str, float] = {}
        for ahead, req in enumerate(sorted(waiting_queue, key=lambda r: r.arrival_time)):
            deadline = self._deadlines.get(req.rid)
            deadlines[req.rid] = clock + factor * ahead if deadline is None else deadline
        self._deadlines = deadlines
        return frozenset(rid for rid, deadline in deadlines.items() if clock >= deadline)

    def _adaptive(
        self, waiting_queue: list[Req], matches: dict[Req, MatchResult], available: int | None
    ) -> str:
        """``adaptive``'s order this pass: LPM when the queue's uncached tokens exceed what the
        pool can give (free plus evictable), so serving it in arrival order would evict
        prefixes that waiting requests match; FCFS when they fit, where a cache-aware order
        saves nothing and only makes requests without a match wait (the starvation trace)."""
        for req in waiting_queue:
            matches[req] = match_req_prefix(req, self.tree_cache)
        need = sum(len(r.fill_ids) - m.cached_len for r, m in matches.items())
        return FCFS if available is not None and need <= available else LPM

    def _active_policy(self, waiting_queue: Sequence[Req]) -> str:
        long_queue = len(waiting_queue) > self.constants.lpm_fallback_queue_len
        if self.policy in (LPM, HRRN, ADAPTIVE) and long_queue:
            return FCFS  # matching every request costs too much on a long queue
        return self.policy

    def _compute_prefix_matches(
        self, waiting_queue: Sequence[Req], matches: dict[Req, MatchResult], in_batch: bool
    ) -> frozenset[str]:
        """Match every request against the real tree into ``matches``; with ``in_batch``, also
        return the rids deprioritized by the in-batch check (see the class docstring)."""
        check = self.constants.in_batch_prefix_caching_check_threshold
        threshold = self.constants.in_batch_prefix_caching_deprioritize_threshold
        deprioritized: set[str] = set()
        sim = self._in_batch_tree
        sim.reset()
        for req in waiting_queue:
            match = matches.get(req)  # adaptive matched them already
            if match is None:
                match = matches[req] = match_req_prefix(req, self.tree_cache)
            if not in_batch or match.cached_len > check:
                continue
            # Match what this request could reuse (all but its last token) against everything the
            # earlier ones will leave in the cache (all of their tokens).
            in_batch_len = len(sim.match_prefix(match_key(req), req.extra_key).indices)
            if in_batch_len >= threshold:
                deprioritized.add(req.rid)
            else:
                fill_ids = req.fill_ids
                sim.insert(fill_ids, torch.empty(len(fill_ids), dtype=torch.int64), req.extra_key)
        return frozenset(deprioritized)

    def _composite_key(
        self, policy: str, facts: PassFacts, aged: frozenset[str] = frozenset()
    ) -> Callable[[Req], tuple[int, int, Any]]:
        policy_key = SORT_KEYS[policy]
        with_priority = self.enable_priority_scheduling
        low_first = self.schedule_low_priority_values_first
        aging = self.is_aging
        bound = self.constants.max_skipped_passes

        def key(req: Req) -> tuple[int, int, Any]:
            rank = urgency_key(req, low_first) if with_priority else 0
            if (aging and req.skipped_passes >= bound) or req.rid in aged:
                return (rank, 0, req.arrival_time)
            return (rank, 1, policy_key(req, facts))

        return key
