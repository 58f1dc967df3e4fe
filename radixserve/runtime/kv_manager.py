"""KVManager: the one owner of KV memory and of every KV field of a request.

It builds the pools once (:meth:`build`, sized from the model's config) and hands the
``KVCache`` and ``ReqToTokenPool`` to the model runner, which only reads and writes K/V through
them. Every change of owner of a KV slot or a request row happens here.

Ownership of one request's row ``req_to_token[r]`` (interval table)::

    [0, prefix_len)        slots shared with the tree, kept alive by the lock on ``last_node``
    [prefix_len, kv_len)   slots the request allocated itself; nobody else frees them
    [kv_len, ...)          garbage

Every path that ends a request's hold on its row (finish, abort, retraction, preemption) goes
through :meth:`release` (or :meth:`swap_out`, which releases first), so the invariant of
:meth:`check_integrity` holds after each of them.

With a KV tier (``TieredRadixCache``) a match may end in the tier: :meth:`alloc_extend` loads
that part back into new slots before the forward that reads it (in the scheduler's thread, so
with the overlap loop it runs while the previous batch computes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.policy import Admission
from radixserve.radix import PrefixCache
from radixserve.radix.base import MatchResult
from radixserve.radix.tier_index import save_index
from radixserve.radix.tiered_cache import TieredRadixCache
from radixserve.radix.tree_node import TreeNode
from radixserve.runtime.kv_layout import KVLayout
from radixserve.runtime.prefix_cache_builder import build_prefix_cache
from radixserve.types import Req

logger = logging.getLogger(__name__)


class KVManager:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: TokenToKVPoolAllocator,
        tree: PrefixCache,
        kv_cache: KVCache | None = None,
    ) -> None:
        """From parts (model-free tests pass no ``kv_cache``); a server uses :meth:`build`."""
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree = tree
        self.kv_cache = kv_cache
        self.page_size = allocator.page_size
        self._corrupt: list[TreeNode] = []  # tier nodes a load-back found corrupt, to drop

    @classmethod
    def build(cls, config: EngineConfig, layout: KVLayout | None = None) -> KVManager:
        """The pools of ``config``'s model: K/V buffers, request rows, the allocator, the tree."""
        layout = layout or KVLayout.from_config(config)
        kv_cache, rows = layout.build_pools(config)
        # the free lists, the rows' slots and the tree's values live on the host whatever the
        # device (no step waits on the device to plan the next); a batch carries its slots over
        allocator = TokenToKVPoolAllocator(kv_cache.num_slots, config.page_size)
        return cls(rows, allocator, build_prefix_cache(config, kv_cache), kv_cache)

    # ---- queries -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    @property
    def max_context_len(self) -> int:
        return self.req_to_token_pool.max_context_len

    def available_size(self) -> int:
        """Slots an allocation can get right now, counting what eviction would free."""
        return self.allocator.available_size() + self.tree.evictable_size()

    @property
    def tiered(self) -> TieredRadixCache | None:
        """The tree, when it has a KV tier under it."""
        return self.tree if isinstance(self.tree, TieredRadixCache) else None

    def row_slots(self, req: Req, start: int = 0, end: int | None = None) -> torch.Tensor:
        end = req.kv_len if end is None else end
        return self.req_to_token_pool.read(_row(req), start, end)

    # ---- allocation for a batch (all or nothing) -----------------------------------------
    def alloc_extend(self, admissions: Sequence[Admission]) -> torch.Tensor | None:
        """Commit a prefill plan: adopt each new admission's match (its row points at the
        cached prefix, no copy; the plan's lock becomes the request's), give rows to those
        without one, and allocate slots for each ``extend_len``, written into the rows.

        Returns the concatenated new slots. When memory is short (even after evicting the
        tree), nothing changed but the new admissions' locks, which are dropped: the caller
        requeues them. The continuing chunked request keeps its row and lock either way.
        """
        reqs = [a.req for a in admissions]
        need_row = [r for r in reqs if r.req_pool_idx is None]
        rows = self.req_to_token_pool.alloc(len(need_row))
        slots = None
        if rows is not None:
            for req, row in zip(need_row, rows, strict=True):
                req.req_pool_idx, req.kv_len = row, 0
            loaded = all(self._adopt(a.req, a.match) for a in admissions if a.match is not None)
            if loaded:
                slots = self._alloc_tokens(reqs, [a.extend_len for a in admissions])
        if slots is None:
            for a in admissions:
                if a.match is not None:
                    self.tree.dec_lock_ref(a.match.last_node)
                    a.req.prefix_indices, a.req.last_node, a.req.kv_len = None, None, 0
            if rows is not None:
                self.req_to_token_pool.free(rows)
                for req in need_row:
                    req.req_pool_idx = None
            self._drop_corrupt()
        else:
            for req in reqs:  # admitted again: the match now holds what it swapped out
                self._drop_swap_lock(req)
        return slots

    def alloc_decode(
        self, reqs: Sequence[Req], new_lens: list[int] | None = None
    ) -> torch.Tensor | None:
        """One slot for each request's next token (or ``new_lens[i]`` slots: the tokens a
        grammar forced, see ``runtime/grammar/jump_forward.py``), or ``None`` (nothing
        allocated)."""
        return self._alloc_tokens(reqs, new_lens or [1] * len(reqs))

    def trim(self, req: Req, kv_len: int) -> None:
        """Keep the KV of the request's first ``kv_len`` tokens only: a verify's rejected drafts
        go. Their slots return to the pool but in the page holding token ``kv_len - 1``, which
        the request keeps (its free tail is where the next tokens go)."""
        if req.req_pool_idx is None or kv_len >= req.kv_len:
            return
        assert kv_len >= req.prefix_len, "a trim reaches into the cached prefix"
        first_free = -(-kv_len // self.page_size) * self.page_size
        if first_free < req.kv_len:
            self.allocator.free(self.row_slots(req, first_free))
        req.kv_len = kv_len

    def cancel(self, admissions: Iterable[Admission]) -> None:
        """Drop the tentative locks of a plan that is not run (see ``policy.prefill_plan``)."""
        for a in admissions:
            if a.match is not None:
                self.tree.dec_lock_ref(a.match.last_node)

    # ---- ownership changes ---------------------------------------------------------------
    def cache_unfinished(self, req: Req) -> None:
        """At a chunk boundary: hand the computed part to the tree and lock it, so it survives
        and other requests can match it while this one continues."""
        if self.tree.is_disabled or req.kv_len == 0:
            return
        slots = self.row_slots(req)
        old_prefix_len = req.prefix_len
        result = self.tree.insert(req.fill_ids[: req.kv_len], slots, req.extra_key)
        present = result.num_present
        if present > old_prefix_len:  # someone cached the same tokens meanwhile: drop our copies
            self.allocator.free(slots[old_prefix_len:present])
        new_prefix = result.indices
        assert new_prefix.shape[0] >= old_prefix_len
        self.req_to_token_pool.write(_row(req), old_prefix_len, new_prefix[old_prefix_len:])
        self.tree.inc_lock_ref(result.last_node)
        if req.last_node is not None:
            self.tree.dec_lock_ref(req.last_node)
        req.prefix_indices, req.last_node = new_prefix, result.last_node

    def release(self, req: Req, insert: bool = True) -> Any:
        """End the request's hold on its row: cache what it computed (``insert``), free what the
        tree did not take, unlock its prefix, return the row (and drop a swap lock). Returns
        the node the cached tokens end at (``None`` when nothing was inserted)."""
        self._drop_swap_lock(req)
        if req.req_pool_idx is None:
            return None
        slots = self.row_slots(req)
        shared = req.prefix_len
        # a request ended inside a verify holds KV past its last token: never cached
        num_slots = min(slots.shape[0], req.seq_len)  # len() of a tensor costs several times more
        aligned = num_slots - num_slots % self.page_size
        node = None
        if insert:
            result = self.tree.insert(req.fill_ids[:num_slots], slots[:num_slots], req.extra_key)
            present, node = result.num_present, result.last_node
        else:
            present = aligned
        # [shared, present): duplicates of what the tree holds; [aligned, kv_len): partial page
        if present > shared:
            self.allocator.free(slots[shared:present])
        if aligned < slots.shape[0]:
            self.allocator.free(slots[aligned:])
        if req.last_node is not None:
            self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.prefix_indices, req.last_node, req.kv_len = None, None, None, 0
        return node

    def send_back(self, req: Req, swap: bool) -> int:
        """Preemption and retraction: :meth:`swap_out` (``swap``) or :meth:`release`, caching
        what it computed (what gets evicted is computed again). Returns tokens swapped out."""
        if swap:
            return self.swap_out(req)
        self.release(req)
        return 0

    def swap_out(self, req: Req) -> int:
        """Preemption or retraction in swap mode: release the request (caching what it
        computed), then move its own nodes to the tier, held there by a lock (``swap_node``)
        until it is admitted again and loads them back. Returns the tokens moved; without a
        tier it only releases."""
        tree = self.tiered
        node = self.release(req)
        if tree is None or node is None or node is tree.root:
            return 0
        tree.inc_lock_ref(node)
        req.swap_node = node
        freed = tree.offload(node)
        self.allocator.free(freed)
        return int(freed.shape[0])

    def save_tier(self) -> int:
        """Write the file tier's index (when idle); nodes written."""
        tree = self.tiered
        return save_index(tree) if tree is not None else 0

    def close_tier(self) -> int:
        """At shutdown: write the file tier's index, then let its directory go (the next
        server may open it); nodes written."""
        tree = self.tiered
        try:
            return self.save_tier()
        finally:
            if tree is not None:
                tree.tier.close()

    def take_kv_events(self) -> list[Any]:
        """The KV events the tree recorded since the last call (``radix/kv_events.py``);
        none when it records none."""
        events = getattr(self.tree, "events", None)
        take = getattr(events, "take", None)
        return take() if take is not None else []

    def flush(self) -> bool:
        """Empty the tree (only when no request holds a row)."""
        if self.req_to_token_pool.available_size() != self.req_to_token_pool.size:
            return False
        self.allocator.free(self.tree.all_values())
        self.tree.reset()
        return True

    # ---- checks --------------------------------------------------------------------------
    def check_integrity(self, reqs: Iterable[Req]) -> None:
        """free + cached + held only by requests == capacity, with no slot counted twice.

        ``reqs``: every request the caller knows (those holding a row are counted)."""
        holders = [r for r in reqs if r.req_pool_idx is not None]
        self.tree.check_integrity()
        own = [self.row_slots(r, r.prefix_len) for r in holders]
        held = torch.cat([self.tree.all_values(), *own])
        self.allocator.check_integrity(held_slots=held)
        self.req_to_token_pool.check_integrity()
        assert (
            self.req_to_token_pool.available_size() + len(holders) == self.req_to_token_pool.size
        ), "a request row leaked"

    # ---- internals -----------------------------------------------------------------------
    def _adopt(self, req: Req, match: MatchResult) -> bool:
        """A newly admitted request takes its cache hit: the pool part as it is, the tier part
        loaded back into new slots (``False``, nothing adopted, when they cannot be had)."""
        prefix = match.indices
        if match.tier_len:
            tree = self.tiered
            assert tree is not None
            # the plan's match may be stale: an admission adopted before this one, or a victim
            # released since, may have loaded part of its tier part already
            match = tree.prefix_of(match.last_node)
            prefix = match.indices
            if match.tier_len and (bad := tree.first_corrupt(match.last_node)) is not None:
                # its copy changed since it was written: the batch is put back, the copy
                # dropped once the batch's locks are (alloc_extend), the prefix computed again
                self._corrupt.append(bad)
                self._drop_swap_lock(req)  # a swapped-out request's KV too: it recomputes
                return False
            if match.tier_len:
                slots = self._alloc_or_evict(match.tier_len)
                if slots is None:
                    return False
                prefix = torch.cat([prefix, tree.load_back(match.last_node, slots)])
        req.prefix_indices, req.last_node = prefix, match.last_node
        if req.prefix_len:
            self.req_to_token_pool.write(_row(req), 0, prefix)
        req.kv_len = req.prefix_len
        return True

    def _drop_corrupt(self) -> None:
        """The tier copies a load-back found corrupt leave the tree: the requests that wanted
        them, back in the queue, match less next time and compute the rest."""
        tree = self.tiered
        for node in self._corrupt:
            dropped = tree is not None and tree.drop_corrupt(node)
            logger.warning(
                "KV tier: a copy of %d tokens failed its checksum at load-back; %s",
                len(node),
                "dropped, computed again" if dropped else "still locked, dropped later",
            )
        self._corrupt.clear()

    def _alloc_or_evict(self, num_tokens: int) -> torch.Tensor | None:
        slots = self.allocator.alloc(num_tokens)
        if slots is None:
            self._evict(num_tokens)
            slots = self.allocator.alloc(num_tokens)
        return slots

    def _drop_swap_lock(self, req: Req) -> None:
        if req.swap_node is not None:
            self.tree.dec_lock_ref(req.swap_node)
            req.swap_node = None

    def _alloc_tokens(self, reqs: Sequence[Req], new_lens: list[int]) -> torch.Tensor | None:
        """Slots for tokens ``kv_len .. kv_len + new_len`` of each request, evicting the tree if
        short, written into the rows. ``None`` (nothing allocated) when memory is short."""
        starts = [r.kv_len for r in reqs]
        ends = [s + n for s, n in zip(starts, new_lens, strict=True)]
        last_locs = [
            int(self.row_slots(r, s - 1, s)[0]) if s > 0 and self.page_size > 1 else 0
            for r, s in zip(reqs, starts, strict=True)
        ]
        slots = self.allocator.alloc_extend(starts, ends, last_locs)
        if slots is None:
            self._evict(sum(ends) - sum(starts) + self.page_size * len(reqs))
            slots = self.allocator.alloc_extend(starts, ends, last_locs)
            if slots is None:
                return None
        # one scatter into req_to_token for the whole batch: row r_i, columns start_i .. end_i
        self.req_to_token_pool.write_spans([_row(r) for r in reqs], starts, new_lens, slots)
        for req, end in zip(reqs, ends, strict=True):
            req.kv_len = end
        return slots

    def _evict(self, num_tokens: int) -> None:
        short = num_tokens - self.allocator.available_size()
        if short > 0:
            self.allocator.free(self.tree.evict(short))


def _row(req: Req) -> int:
    assert req.req_pool_idx is not None, "the request holds no row"
    return req.req_pool_idx
