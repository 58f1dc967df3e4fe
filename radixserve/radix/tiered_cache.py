"""TieredRadixCache: the radix tree over two tiers, the KV pool and a larger, slower ``KVTier``.

SGLang's hierarchical cache (``HiRadixCache``) in one tree. Each node is in one of three states:

    D   ``value`` (pool slots), no tier copy
    DT  ``value`` and ``tier_value``: a copy in each
    T   ``tier_value`` only: evicted from the pool, kept in the tier

Nodes in the pool form a subtree under the root: a T node's descendants are all T, so a match
walks pool nodes first, then tier nodes (``MatchResult.indices`` and ``tier_len``).

- **Pool eviction** (:meth:`evict`) takes least recently used unlocked nodes with no child in
  the pool. One with a tier copy becomes T; one without is written to the tier first
  (``write_back``), making room there by the tier's own LRU eviction; when even that fails it
  is dropped with its T subtree, as in a plain tree.
- **write_through** copies every new node to the tier when it is inserted, so a pool eviction
  later only frees slots. The caller inserts only KV that is computed (the scheduler waits for a
  chunk in flight first).
- **Tier eviction** is LRU over tier copies with no tier copy below them: a T node is deleted,
  a DT node keeps its pool part. Locked nodes are never evicted from either tier.
- **Load-back** (:meth:`load_back`): the owner of the pool (``KVManager``) allocates slots for a
  match's tier part and the tree copies it in (one copy per layer and K/V); the nodes become DT.
- **Offload** (:meth:`offload`): swap preemption moves a locked request's own nodes to the tier.

The tree owns the tier's slots (it writes, reads and forgets them); pool slots stay the
caller's to free, as in :class:`RadixCache`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import torch

from radixserve.memory_pool.kv_cache import KVCache
from radixserve.memory_pool.kv_tier import KVTier
from radixserve.radix.base import InsertResult, MatchResult, TokenKey
from radixserve.radix.radix_cache import _EMPTY_VALUE, RadixCache, _cat, _key_bytes
from radixserve.radix.tree_node import TreeNode
from radixserve.radix.tree_observer import FILE_TIER, HOST_TIER, POOL, TreeObserver

WRITE_POLICIES = ("write_back", "write_through")


class TieredRadixCache(RadixCache):
    """A :class:`RadixCache` whose evicted nodes live on in ``tier`` (see the module doc)."""

    def __init__(
        self,
        page_size: int,
        tier: KVTier,
        kv: KVCache,
        write_policy: str = "write_back",
        events: TreeObserver | None = None,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        if tier.layout.page_size != page_size:
            raise ValueError(f"tier pages of {tier.layout.page_size} under a tree of {page_size}")
        self.tier = tier
        self.kv = kv
        self.write_policy = write_policy
        self.num_written_tokens = 0  # pool -> tier copies
        self.num_loaded_tokens = 0  # tier -> pool copies
        self._tier_medium = FILE_TIER if tier.name.startswith("file:") else HOST_TIER
        super().__init__(page_size, events)

    # ---- queries -------------------------------------------------------------------------
    def match_prefix(self, key: TokenKey, extra_key: str | None = None) -> MatchResult:
        node, _, values = self._walk(_key_bytes(key), extra_key)
        return self._match_at(node, values)

    def prefix_of(self, node: TreeNode) -> MatchResult:
        """What a match ending at ``node`` is now, without a walk. A locked match keeps its
        length but may have gone stale: a load-back or an insert since (another admission of
        the batch, a preempted request's release) may have brought part of its tier part into
        the pool."""
        values = []
        n = node
        while n is not self._root:
            values.append(n.value)
            n = n.parent  # type: ignore[assignment]
        return self._match_at(node, values[::-1])

    def tier_size(self) -> int:
        """Tokens with a copy in the tier."""
        return self.tier.used_size()

    def all_tier_values(self) -> torch.Tensor:
        values = [n.tier_value for n in self._nodes() if n.tier_value is not None]
        return torch.cat(values) if values else _EMPTY_VALUE

    # ---- commits -------------------------------------------------------------------------
    def insert(
        self, key: TokenKey, value: torch.Tensor, extra_key: str | None = None
    ) -> InsertResult:
        """As :meth:`RadixCache.insert`; tier-only nodes on the key's path take the caller's
        slots (they were computed again), and count as not present."""
        key_bytes, node, pos, values = self._walk_to_insert(key, value, extra_key)
        path = self._tier_path(node)
        present = pos - sum(len(n) for n in path)
        if path:
            self._to_pool(path, value[present:pos].clone())
            values[len(values) - len(path) :] = [n.value for n in path]  # type: ignore[misc]
        result = self._insert_after_walk(node, pos, values, key_bytes, value, extra_key, present)
        last = result.last_node
        if self.write_policy == "write_through" and last is not self._root:
            if last.tier_value is None:
                self._backup(last)
        return result

    def _evict_leaf(self, leaf: TreeNode) -> None:
        """The pool took ``leaf``'s slots: it moves to the tier (written there first if it has
        no copy), or leaves the tree with its tier subtree when the tier has no room."""
        self._leaves.discard(leaf)
        if self.events is not None:
            self.events.removed(leaf, POOL)
        if leaf.tier_value is not None or self._backup(leaf):
            leaf.value = None
        else:
            self._drop_subtree(leaf)
        self._maybe_pool_leaf(leaf.parent)  # type: ignore[arg-type]

    def load_back(self, node: TreeNode, slots: torch.Tensor) -> torch.Tensor:
        """Copy the tier part of the path ending at ``node`` (``MatchResult.tier_len`` tokens;
        the caller holds a lock on ``node``) into the pool ``slots`` it allocated, which the tree
        takes. Returns them, in path order."""
        path = self._tier_path(node)
        tier_slots = _cat([n.tier_value for n in path])  # type: ignore[misc]
        if tier_slots.shape[0] != slots.shape[0]:
            raise ValueError(f"{slots.shape[0]} slots for a tier part of {tier_slots.shape[0]}")
        self.tier.read(tier_slots, self.kv, slots)
        self.num_loaded_tokens += slots.shape[0]
        self._to_pool(path, slots)
        return slots

    def first_corrupt(self, node: TreeNode) -> TreeNode | None:
        """The first node (top down) of the tier part of the path ending at ``node`` whose
        copy fails the checksums it was written with for the tokens on its path (a file tier's
        pages; a tier without checksums has none), or None: checked right before a load-back."""
        path = self._tier_path(node)
        seq = self.tier.sequence_hash(node.extra_key) if path else None
        if seq is None:
            return None
        seq.update(self._tokens_above(path[0]))
        for n in path:
            keys = seq.page_keys(n.key_bytes, self.page_size)
            if bool(self.tier.corrupt_pages(n.tier_value, keys).any()):  # type: ignore[arg-type]
                return n
        return None

    def drop_corrupt(self, node: TreeNode) -> bool:
        """Forget the tier-only ``node`` (its copy failed its checksum) with its tier-only
        subtree, so no match reaches it again; False (left in place) while a lock holds it."""
        if node.lock_ref or node.value is not None:
            return False
        assert node.tier_value is not None
        self._forget_tier_copy(node)
        self._drop_subtree(node)
        return True

    def offload(self, node: TreeNode) -> torch.Tensor:
        """Swap out: move the pool part of the path ending at ``node`` that only the caller's one
        lock holds (``lock_ref == 1``) and no other pool node hangs under, bottom up, to the
        tier. Returns the pool slots the caller frees; the nodes stay locked, now in the tier."""
        freed: list[torch.Tensor] = []
        while node is not self._root and node.lock_ref == 1 and node in self._leaves:
            if node.tier_value is None and not self._backup(node):
                break
            assert node.value is not None
            freed.append(node.value)
            self._protected_size -= len(node)
            if self.events is not None:
                self.events.removed(node, POOL)
            node.value = None
            self._leaves.discard(node)
            parent = node.parent
            assert parent is not None
            self._maybe_pool_leaf(parent)
            node = parent
        return torch.cat(freed[::-1]) if freed else _EMPTY_VALUE

    def write_back_all(self) -> int:
        """Copy every pool node without a tier copy to the tier, parents first (before a file
        tier's index is saved, so a restart finds what ``write_back`` had not yet written);
        a node that does not fit is skipped with what hangs under it. Tokens written."""
        written = 0
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.value is not None and node.tier_value is None:
                if not self._backup(node):
                    continue
                written += len(node)
            stack.extend(node.children.values())
        return written

    def restore_node(
        self, parent: TreeNode, key_bytes: bytes, tier_slots: torch.Tensor, extra_key: str | None
    ) -> TreeNode:
        """Hang a tier-only node found in a reopened tier (``radix.tier_index``) under
        ``parent`` (the root or a node restored before it); the caller claimed its slots."""
        node = TreeNode(next(self._node_ids), key_bytes, None, parent, extra_key)
        node.tier_value = tier_slots
        parent.children[self._child_key(parent, extra_key, key_bytes)] = node
        self._push_tier_lru(node)
        if self.events is not None:
            self.events.stored(node, self._tier_medium)
        return node

    def reset(self) -> None:
        if hasattr(self, "_root"):
            held = self.all_tier_values()
            if held.shape[0]:
                self.tier.forget(held)
        super().reset()
        # (access time, id, node) of nodes with a tier copy: one entry each, re-pushed when
        # found stale or set aside, dropped once the node has no copy
        self._tier_lru: list[tuple[int, int, TreeNode]] = []

    def check_integrity(self, unique_values: bool = True) -> None:
        """The pool tree's checks, and: a tier-only node's children are tier-only, tier slots are
        unique and with the tier's free ones make up the tier, every copy has an LRU entry."""
        super().check_integrity(unique_values)
        nodes = [n for n in self._nodes() if n is not self._root]
        for n in nodes:
            if n.value is None:
                assert all(c.value is None for c in n.children.values()), "a pool node under T"
        held = self.all_tier_values()
        assert len(torch.unique(held)) == len(held), "a tier slot is held by two nodes"
        self.tier.check_integrity(held)
        entries = {id(n) for _, _, n in self._tier_lru}
        assert all(id(n) in entries for n in nodes if n.tier_value is not None), "no tier entry"

    # ---- internals -----------------------------------------------------------------------
    def _push_tier_lru(self, node: TreeNode) -> None:
        """An entry for ``node``'s tier copy at its current access time."""
        heapq.heappush(self._tier_lru, (node.last_access_time, node.id, node))

    def _match_at(self, node: TreeNode, values: Sequence[torch.Tensor | None]) -> MatchResult:
        """The match ending at ``node``, given the values of its path (root first; ``None`` for
        the tier-only tail)."""
        path = self._tier_path(node)
        device = values[: len(values) - len(path)]
        return MatchResult(_cat(device), node, sum(len(n) for n in path))  # type: ignore[arg-type]

    def _tier_path(self, node: TreeNode) -> list[TreeNode]:
        """The tier-only nodes ending at ``node``, top down."""
        path = []
        while node.value is None and node is not self._root:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        return path[::-1]

    def _to_pool(self, path: list[TreeNode], slots: torch.Tensor) -> None:
        """Give the tier-only ``path`` (top down) the pool ``slots``: the nodes become DT."""
        off = 0
        for n in path:
            n.value = slots[off : off + len(n)]
            off += len(n)
            if self.events is not None:
                self.events.stored(n, POOL)
            if n.lock_ref:
                self._protected_size += len(n)
            else:
                self._evictable_size += len(n)
        self._leaves.discard(path[0].parent)  # type: ignore[arg-type]
        self._leaves.add(path[-1])
        self._push_lru(path[-1])

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        upper = super()._split(child, n)
        if upper.tier_value is not None:  # the upper part of a tier copy: its own LRU entry
            self._push_tier_lru(upper)
        return upper

    def _maybe_pool_leaf(self, node: TreeNode) -> None:
        """``node`` lost a child in the pool: it may now be a pool leaf."""
        if node is self._root or node.value is None:
            return
        if all(c.value is None for c in node.children.values()):
            self._leaves.add(node)
            self._push_lru(node)

    def _backup(self, node: TreeNode) -> bool:
        """Write ``node``'s pool KV to the tier (evicting the tier's LRU if short)."""
        assert node.value is not None and node.tier_value is None
        need = len(node)
        if need > self.tier.capacity:
            return False
        if self.tier.available_size() < need:
            self._evict_tier(need - self.tier.available_size())
        tier_slots = self.tier.write(self.kv, node.value, self._page_keys(node))
        if tier_slots is None:
            return False
        node.tier_value = tier_slots
        self.num_written_tokens += need
        self._push_tier_lru(node)
        if self.events is not None:
            self.events.stored(node, self._tier_medium)
        return True

    def _page_keys(self, node: TreeNode) -> np.ndarray | None:
        """What each page of ``node`` holds, for a tier with checksums: the keys of its pages
        after every token above it (``KVTier.sequence_hash``)."""
        seq = self.tier.sequence_hash(node.extra_key)
        if seq is None:
            return None
        seq.update(self._tokens_above(node))
        return seq.page_keys(node.key_bytes, self.page_size)

    def _tokens_above(self, node: TreeNode) -> bytes:
        """The tokens of the path from the root down to ``node``'s parent, as int32 bytes."""
        parts = []
        n = node.parent
        while n is not None and n is not self._root:
            parts.append(n.key_bytes)
            n = n.parent
        return b"".join(parts[::-1])

    def _evict_tier(self, num_tokens: int) -> None:
        """Forget tier copies with no copy below them, least recently used first, until
        ``num_tokens`` tier slots are free or none is left; a tier-only node goes with its copy."""
        heap, aside = self._tier_lru, {}
        num_freed = 0
        while num_freed < num_tokens and heap:
            entry = heapq.heappop(heap)
            t, _, node = entry
            if node.tier_value is None:
                continue  # no copy any more: the entry goes
            if t != node.last_access_time:
                self._push_tier_lru(node)
                continue
            if node.lock_ref or any(c.tier_value is not None for c in node.children.values()):
                aside[node.id] = entry
                continue
            num_freed += len(node)
            self._forget_tier_copy(node)
            parent = node.parent
            assert parent is not None
            if node.value is None:  # tier-only, and with no child: it leaves the tree
                self._unlink(node)
            waiting = aside.pop(parent.id, None)  # set aside for this copy: it may go now
            if waiting is not None:
                heapq.heappush(heap, waiting)
        for entry in aside.values():
            heapq.heappush(heap, entry)

    def _drop_subtree(self, node: TreeNode) -> None:
        """Delete ``node`` (its pool slots already taken by the caller) and its tier-only
        subtree, forgetting their tier copies."""
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.tier_value is not None:
                self._forget_tier_copy(n)
        node.children = {}
        self._unlink(node)

    def _forget_tier_copy(self, node: TreeNode) -> None:
        if self.events is not None:
            self.events.removed(node, self._tier_medium)
        self.tier.forget(node.tier_value)  # type: ignore[arg-type]
        node.tier_value = None

    def _unlink(self, node: TreeNode) -> None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[self._child_key(parent, node.extra_key, node.key_bytes)]
        self._leaves.discard(node)
        node.value = None
