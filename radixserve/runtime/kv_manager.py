"""KVManager: where KV slots change owner between the allocator, the tree and the requests.

Ownership of one request's row ``req_to_token[r]`` (interval table)::

    [0, prefix_len)        slots shared with the tree, kept alive by the lock on ``last_node``
    [prefix_len, kv_len)   slots the request allocated itself; nobody else frees them
    [kv_len, ...)          garbage

Every path that ends a request's hold on its row (finish, abort, retraction, preemption) goes
through :meth:`release`, so the invariant of :meth:`check_integrity` holds after each of them.
"""

from __future__ import annotations

import torch

from radixserve.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.radix import PrefixCache
from radixserve.types import Req


class KVManager:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: TokenToKVPoolAllocator,
        tree: PrefixCache,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree = tree
        self.page_size = allocator.page_size
        self.holders: dict[str, Req] = {}  # rid -> request that holds a row

    # ---- queries -------------------------------------------------------------------------
    def available_size(self) -> int:
        """Slots an allocation can get right now, counting what eviction would free."""
        return self.allocator.available_size() + self.tree.evictable_size()

    def row_slots(self, req: Req, start: int = 0, end: int | None = None) -> torch.Tensor:
        end = req.kv_len if end is None else end
        return self.req_to_token_pool.req_to_token[_row(req), start:end].to(torch.int64)

    # ---- allocation ----------------------------------------------------------------------
    def alloc_rows(self, reqs: list[Req]) -> bool:
        """Give every request without a row one; all or nothing."""
        need = [r for r in reqs if r.req_pool_idx is None]
        rows = self.req_to_token_pool.alloc(len(need))
        if rows is None:
            return False
        for req, row in zip(need, rows, strict=True):
            req.req_pool_idx = row
            req.kv_len = 0
            self.holders[req.rid] = req
        return True

    def alloc_tokens(self, reqs: list[Req], new_lens: list[int]) -> torch.Tensor | None:
        """Slots for tokens ``kv_len .. kv_len + new_len`` of each request, evicting the tree if
        short, written into the rows (after the shared prefix, which the rows receive too).
        Returns the concatenated new slots, or ``None`` (nothing allocated) when memory is short."""
        starts = [r.kv_len for r in reqs]
        ends = [s + n for s, n in zip(starts, new_lens, strict=True)]
        last_locs = [
            int(self.row_slots(r, s - 1, s)[0]) if s > 0 and self.page_size > 1 else 0
            for r, s in zip(reqs, starts, strict=True)
        ]
        slots = self.allocator.alloc_extend(starts, ends, last_locs)
        if slots is None:
            self.evict(sum(ends) - sum(starts) + self.page_size * len(reqs))
            slots = self.allocator.alloc_extend(starts, ends, last_locs)
            if slots is None:
                return None
        # one scatter into req_to_token for the whole batch: row r_i, columns start_i .. end_i
        row_ids = torch.tensor([_row(r) for r in reqs], dtype=torch.int64)
        if len(slots) == len(reqs):  # decode: one token each
            rows, cols = row_ids, torch.tensor(starts, dtype=torch.int64)
        else:
            lens = torch.tensor(new_lens, dtype=torch.int64)
            rows = torch.repeat_interleave(row_ids, lens)
            offsets = torch.tensor(starts, dtype=torch.int64) - (torch.cumsum(lens, 0) - lens)
            cols = torch.repeat_interleave(offsets, lens) + torch.arange(len(slots))
        table = self.req_to_token_pool.req_to_token
        table[rows.to(table.device), cols.to(table.device)] = slots.to(table.dtype)
        for req, end in zip(reqs, ends, strict=True):
            req.kv_len = end
        return slots

    def adopt_prefix(self, req: Req) -> None:
        """Point a freshly admitted request's row at its cached prefix (no copy: a cache hit)."""
        assert req.req_pool_idx is not None and req.kv_len <= req.prefix_len
        if req.prefix_len:
            self.req_to_token_pool.write(_row(req), 0, req.prefix_indices)
        req.kv_len = req.prefix_len

    def evict(self, num_tokens: int) -> None:
        short = num_tokens - self.allocator.available_size()
        if short > 0:
            self.allocator.free(self.tree.evict(short))

    # ---- ownership changes ---------------------------------------------------------------
    def cache_unfinished(self, req: Req) -> None:
        """At a chunk boundary: hand the computed part to the tree and lock it, so it survives
        and other requests can match it while this one continues."""
        if self.tree.is_disabled or req.kv_len == 0:
            return
        key = req.fill_ids[: req.kv_len]
        slots = self.row_slots(req)
        old_prefix_len = req.prefix_len
        present = self.tree.insert(key, slots, req.extra_key)
        if present > old_prefix_len:  # someone cached the same tokens meanwhile: drop our copies
            self.allocator.free(slots[old_prefix_len:present])
        result = self.tree.match_prefix(key, req.extra_key)
        new_prefix = result.indices
        assert len(new_prefix) >= old_prefix_len
        self.req_to_token_pool.write(_row(req), old_prefix_len, new_prefix[old_prefix_len:])
        self.tree.inc_lock_ref(result.last_node)
        if req.last_node is not None:
            self.tree.dec_lock_ref(req.last_node)
        req.prefix_indices, req.last_node = new_prefix, result.last_node

    def release(self, req: Req, insert: bool = True) -> None:
        """End the request's hold on its row: cache what it computed (``insert``), free what the
        tree did not take, unlock its prefix, return the row."""
        if req.req_pool_idx is None:
            return
        slots = self.row_slots(req)
        shared = req.prefix_len
        aligned = len(slots) - len(slots) % self.page_size
        if insert:
            present = self.tree.insert(req.fill_ids[: req.kv_len], slots, req.extra_key)
        else:
            present = aligned
        # [shared, present): duplicates of what the tree holds; [aligned, kv_len): partial page
        if present > shared:
            self.allocator.free(slots[shared:present])
        if aligned < len(slots):
            self.allocator.free(slots[aligned:])
        if req.last_node is not None:
            self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        self.holders.pop(req.rid, None)
        req.req_pool_idx, req.prefix_indices, req.last_node, req.kv_len = None, None, None, 0

    def unlock_unadmitted(self, req: Req) -> None:
        """Drop the lock the admission pass took for a request that did not get to run."""
        if req.last_node is not None and req.req_pool_idx is None:
            self.tree.dec_lock_ref(req.last_node)
            req.last_node, req.prefix_indices = None, None

    def flush(self) -> bool:
        """Empty the tree (only when no request holds a row)."""
        if self.holders:
            return False
        self.allocator.free(self.tree.all_values())
        self.tree.reset()
        return True

    # ---- checks --------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """free + cached + held only by requests == capacity, with no slot counted twice."""
        self.tree.check_integrity()
        own = [self.row_slots(r, r.prefix_len) for r in self.holders.values()]
        held = torch.cat([self.tree.all_values(), *own])
        self.allocator.check_integrity(held_slots=held)
        self.req_to_token_pool.check_integrity()
        assert (
            self.req_to_token_pool.available_size() + len(self.holders)
            == self.req_to_token_pool.size
        ), "a request row leaked"


def _row(req: Req) -> int:
    assert req.req_pool_idx is not None, "the request holds no row"
    return req.req_pool_idx
