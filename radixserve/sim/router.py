"""The routing policies of sglang-router (0.3.2), for N simulated replicas.

- ``round_robin``: replicas in turn.
- ``power_of_two``: two distinct replicas at random; the one with fewer requests in flight.
- ``cache_aware``: sglang-router's approximate-tree policy, with its documented thresholds
  (``RouterArgs`` defaults). The router keeps, per replica, a tree of what it sent there
  (it never sees the replica's real cache). For each request:

  1. if the load is imbalanced, ``max_load - min_load > balance_abs_threshold`` and
     ``max_load > min_load * balance_rel_threshold`` (load: requests in flight), the least
     loaded replica;
  2. else the replica whose tree matches the longest prefix, if the match rate
     ``matched / prompt_len`` exceeds ``cache_threshold``;
  3. else the replica with the smallest tree (the most room).

  The prompt goes into the chosen replica's tree. Every ``eviction_interval_secs`` of
  (virtual) time, trees larger than ``max_tree_size`` are cut back by LRU.

  The one difference: sglang-router's trees hold characters of the request text; here they
  hold token ids (the simulator has no text), so sizes and thresholds count tokens.
- ``cache_aware_events``: smg's event-driven cache-aware routing (``select_worker_event_driven``
  in its ``policies/cache_aware.rs``). The router knows what each replica really holds from
  the replica's own KV events (``radix/kv_events.py``), applied when the step that produced
  them ends, as a gateway hears them. Past the same load imbalance, the least loaded replica;
  else the replica holding the longest run of the request's leading pages (any overlap counts,
  no threshold), ties to the lower load, then the fewer pages held; with no overlap anywhere, the
  least loaded (ties: fewer requests routed, then the lower index). The request's pages are
  hashed as the replicas hash theirs, in the default namespace: a LoRA session's pages live in
  its adapter's namespace and match nothing here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.radix import RadixCache
from radixserve.radix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    digests_to_int64,
    page_digests,
)

ROUTER_POLICIES = ("round_robin", "cache_aware", "power_of_two", "cache_aware_events")
EVENT_POLICIES = ("cache_aware_events",)  # their replicas publish KV events


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    """sglang-router's ``RouterArgs`` defaults (0.3.2)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: float = 60.0
    max_tree_size: int = 2**26

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0, balance_rel_threshold >= 1")
        if self.eviction_interval_secs <= 0 or self.max_tree_size < 1:
            raise ValueError("eviction_interval_secs must be > 0 and max_tree_size >= 1")


class Router:
    """Picks a replica for each request; the caller reports when a request is done
    (``loads``: requests in flight per replica, as the router counts them)."""

    def __init__(
        self,
        policy: str,
        num_replicas: int,
        cache_aware: CacheAwareConfig | None = None,
        seed: int = 0,
        page_size: int = 1,
    ) -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"router policy must be one of {ROUTER_POLICIES}, got {policy!r}")
        if num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")
        self.policy = policy
        self.n = num_replicas
        self.config = cache_aware or CacheAwareConfig()
        self.loads = [0] * num_replicas
        self.num_routed = [0] * num_replicas
        self._next = 0
        self._rng = random.Random(seed)
        self._trees = [RadixCache.create_simulated() for _ in range(num_replicas)]
        self._zeros = torch.zeros(0, dtype=torch.int64)
        self._next_eviction = self.config.eviction_interval_secs
        self.num_cache_routed = 0  # cache_aware: routed by a prefix match above the threshold
        self.num_balance_routed = 0  # cache_aware: routed to the least loaded (imbalance)
        self.page_size = page_size
        # cache_aware_events: each replica's pages as its events say (hash -> media holding it)
        self._held: list[dict[int, int]] = [{} for _ in range(num_replicas)]

    def pick(self, tokens: np.ndarray, now: float) -> int:
        if self.n == 1:
            i = 0
        elif self.policy == "round_robin":
            i, self._next = self._next, (self._next + 1) % self.n
        elif self.policy == "power_of_two":
            a, b = self._rng.sample(range(self.n), 2)
            i = a if self.loads[a] <= self.loads[b] else b
        elif self.policy == "cache_aware":
            i = self._cache_aware(tokens, now)
        else:
            i = self._cache_aware_events(tokens)
        self.loads[i] += 1
        self.num_routed[i] += 1
        return i

    def done(self, replica: int) -> None:
        self.loads[replica] -= 1

    def observe(self, replica: int, events: list[KVCacheEvent]) -> None:
        """A replica's KV events reach the router (``cache_aware_events``)."""
        held = self._held[replica]
        for event in events:
            if isinstance(event, BlockStored):
                for h in event.block_hashes:
                    held[h] = held.get(h, 0) + 1
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    if held[h] == 1:
                        del held[h]
                    else:
                        held[h] -= 1
            else:
                assert isinstance(event, AllBlocksCleared)
                held.clear()

    def _least_loaded(self) -> int:
        return min(range(self.n), key=lambda i: (self.loads[i], self.num_routed[i], i))

    def _imbalanced(self) -> bool:
        c = self.config
        lo, hi = min(self.loads), max(self.loads)
        return hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold

    def _cache_aware_events(self, tokens: np.ndarray) -> int:
        if self._imbalanced():
            self.num_balance_routed += 1
            return self._least_loaded()
        key = np.asarray(tokens, dtype=np.int32)
        key = key[: len(key) - len(key) % self.page_size]
        hashes = digests_to_int64(page_digests(key.tobytes(), 4 * self.page_size))
        best, best_key = -1, None
        for i, held in enumerate(self._held):
            n = 0
            for h in hashes:
                if h not in held:
                    break
                n += 1
            rank = (n, -self.loads[i], -len(held), i)  # Rust's max_by_key: the last of equals
            if n and (best_key is None or rank > best_key):
                best, best_key = i, rank
        if best < 0:
            return self._least_loaded()
        self.num_cache_routed += 1
        return best

    def _cache_aware(self, tokens: np.ndarray, now: float) -> int:
        c = self.config
        if now >= self._next_eviction:
            for tree in self._trees:
                excess = tree.total_size() - c.max_tree_size
                if excess > 0:
                    tree.evict(excess)
            self._next_eviction = now + c.eviction_interval_secs
        if self._imbalanced():
            self.num_balance_routed += 1
            i = self.loads.index(min(self.loads))
        else:
            matched = [len(t.match_prefix(tokens).indices) for t in self._trees]
            best = max(matched)
            if len(tokens) and best / len(tokens) > c.cache_threshold:
                self.num_cache_routed += 1
                i = matched.index(best)
            else:
                sizes = [t.total_size() for t in self._trees]
                i = sizes.index(min(sizes))
        n = len(tokens)
        if len(self._zeros) < n:
            self._zeros = torch.zeros(2 * n, dtype=torch.int64)
        self._trees[i].insert(tokens, self._zeros[:n])
        return i
