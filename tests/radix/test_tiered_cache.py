"""TieredRadixCache over a real KV pool and a host tier: which nodes move where, and that the K/V
bytes that come back are the ones that went out (each prefix's K/V is a known function of it)."""

from __future__ import annotations

import pytest
import torch
from tier_helpers import (
    expected_kv,
    insert_computed,
    new_pool,
    path_tokens,
    pool_kv,
    tier_kv,
)

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_tier import TierLayout, host_tier
from radixserve.radix.base import InsertResult
from radixserve.radix.tiered_cache import TieredRadixCache

PAGE_SIZES = [1, 4]


class Rig:
    """A pool of ``pool_tokens`` usable slots, a host tier of ``tier_tokens``, and the tree."""

    def __init__(
        self, ps: int, pool_tokens: int = 64, tier_tokens: int = 32, policy: str = "write_back"
    ) -> None:
        self.ps = ps
        self.kv = new_pool(pool_tokens + ps)
        self.alloc = TokenToKVPoolAllocator(pool_tokens + ps, ps)
        self.tier = host_tier(TierLayout.of(self.kv, ps), tier_tokens)
        assert self.tier.capacity == tier_tokens
        self.tree = TieredRadixCache(ps, self.tier, self.kv, policy)

    def key(self, first: int, pages: int) -> list[int]:
        """``pages`` pages of tokens starting at ``first`` (distinct keys start differently)."""
        return list(range(first, first + pages * self.ps))

    def insert(self, key: list[int]) -> InsertResult:
        result = insert_computed(self.kv, self.alloc, self.tree, key)
        assert result is not None
        return result

    def evict(self, num_tokens: int) -> torch.Tensor:
        freed = self.tree.evict(num_tokens)
        self.alloc.free(freed)
        return freed

    def load_back(self, key: list[int]) -> torch.Tensor:
        """Match ``key``, lock it, load its tier part into fresh (NaN) slots, check the pool
        K/V of the whole match; returns the match's pool slots. The lock stays (caller's)."""
        match = self.tree.match_prefix(key)
        self.tree.inc_lock_ref(match.last_node)
        slots = self.alloc.alloc(match.tier_len)
        if slots is None:  # as ``KVManager._alloc_or_evict``
            self.evict(match.tier_len)
            slots = self.alloc.alloc(match.tier_len)
        assert slots is not None
        for layer in range(self.kv.num_layers):
            for t in self.kv.get_kv(layer):
                t[slots] = float("nan")
        loaded = self.tree.load_back(match.last_node, slots)
        assert torch.equal(loaded, slots)
        prefix = torch.cat([match.indices, slots])
        assert torch.equal(pool_kv(self.kv, prefix), expected_kv(key, 0, match.cached_len))
        return prefix

    def check(self) -> None:
        self.tree.check_integrity()
        self.alloc.check_integrity(self.tree.all_values())

    def check_tier_content(self) -> None:
        """Every tier copy holds its prefix's K/V, every pool value too."""
        for node in self.tree._nodes():
            if node is self.tree.root:
                continue
            tokens = path_tokens(node)
            want = expected_kv(tokens, len(tokens) - len(node), len(tokens))
            if node.tier_value is not None:
                assert torch.equal(tier_kv(self.tier, node.tier_value), want)
            if node.value is not None:
                assert torch.equal(pool_kv(self.kv, node.value), want)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_evict_moves_a_leaf_to_the_tier(ps: int) -> None:
    rig = Rig(ps)
    key = rig.key(1, 4)
    slots = rig.insert(key).indices.clone()
    node = rig.tree.match_prefix(key).last_node
    assert node.value is not None and node.tier_value is None  # write_back: no copy yet
    freed = rig.evict(1)
    assert torch.equal(freed, slots)
    assert node.value is None and node.tier_value is not None  # T: in the tier only
    assert torch.equal(tier_kv(rig.tier, node.tier_value), expected_kv(key, 0, len(key)))
    assert rig.tree.num_written_tokens == len(key) == rig.tree.tier_size()
    assert rig.tree.total_size() == rig.tree.evictable_size() == 0
    match = rig.tree.match_prefix(key + [99])
    assert match.indices.numel() == 0 and match.tier_len == len(key)
    assert match.last_node is node and match.cached_len == len(key)
    assert rig.evict(100).numel() == 0  # nothing left in the pool
    rig.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_match_reports_the_pool_part_and_the_tier_len(ps: int) -> None:
    rig = Rig(ps)
    head, tail = rig.key(1, 2), rig.key(50, 3)
    rig.insert(head)
    full = rig.insert(head + tail).indices.clone()
    rig.evict(1)  # the one pool leaf: the tail
    match = rig.tree.match_prefix(head + tail + [7] * ps)
    assert torch.equal(match.indices, full[: len(head)]) and match.tier_len == len(tail)
    assert path_tokens(match.last_node) == head + tail
    half = rig.tree.match_prefix(head + tail[:ps])  # splits the tier node
    assert torch.equal(half.indices, full[: len(head)]) and half.tier_len == ps
    assert rig.tree.match_prefix(tail).cached_len == 0  # another first page
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_load_back_copies_the_exact_kv_into_the_callers_slots(ps: int) -> None:
    rig = Rig(ps, pool_tokens=5 * ps)
    head, tail, other = rig.key(1, 2), rig.key(50, 3), rig.key(100, 3)
    full = rig.insert(head + tail).indices.clone()
    rig.tree.match_prefix(head)  # splits: head (D) -> tail (D)
    rig.evict(len(tail))
    # another prefix computed into the slots tail left (the pool holds nothing else)
    assert torch.equal(rig.insert(other).indices.sort().values, full[len(head) :].sort().values)
    assert rig.tree.match_prefix(head + tail).tier_len == len(tail)
    prefix = rig.load_back(head + tail)  # evicts other for room; checks the K/V of the match
    assert rig.tree.match_prefix(other).tier_len == len(other)
    node = rig.tree.match_prefix(head + tail).last_node
    assert node.value is not None and node.tier_value is not None  # DT now
    assert rig.tree.num_loaded_tokens == len(tail)
    assert torch.equal(rig.tree.match_prefix(head + tail).indices, prefix)
    assert rig.tree.protected_size() == len(head + tail)
    rig.check()
    rig.tree.dec_lock_ref(node)
    # evicting everything writes back what has no copy (head), never tail again
    assert rig.tree.num_written_tokens == len(tail + other)
    rig.evict(100)
    assert rig.tree.num_written_tokens == len(tail + other + head)
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_write_through_copies_on_insert_and_eviction_writes_nothing(ps: int) -> None:
    rig = Rig(ps, policy="write_through")
    head, tail = rig.key(1, 2), rig.key(50, 2)
    rig.insert(head)
    node = rig.tree.match_prefix(head).last_node
    assert node.value is not None and node.tier_value is not None
    assert rig.tree.num_written_tokens == len(head)
    rig.check_tier_content()
    assert rig.evict(1).numel() == len(head)
    assert node.value is None and rig.tree.num_written_tokens == len(head)  # no second copy
    # computing head + tail again: the tier-only head takes the caller's slots back
    result = rig.insert(head + tail)
    assert result.num_present == 0  # the tier part counts as not present
    assert node.value is not None and torch.equal(node.value, result.indices[: len(head)])
    assert rig.tree.num_written_tokens == len(head + tail)  # the new leaf only
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_a_full_tier_evicts_its_least_recently_used_copy(ps: int) -> None:
    rig = Rig(ps, tier_tokens=4 * ps)
    a, b, c = rig.key(1, 2), rig.key(20, 2), rig.key(40, 2)
    rig.insert(a)
    rig.insert(b)
    rig.evict(100)
    assert rig.tier.available_size() == 0
    rig.tree.match_prefix(a)  # a is now more recent than b in the tier too
    rig.insert(c)
    rig.evict(100)  # c's write-back makes room: b (tier-only, the coldest) leaves the tree
    assert rig.tree.match_prefix(b).cached_len == 0
    assert rig.tree.match_prefix(a).tier_len == len(a)
    assert rig.tree.match_prefix(c).tier_len == len(c)
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_a_tier_copy_with_a_copy_below_it_is_not_evicted_first(ps: int) -> None:
    rig = Rig(ps, tier_tokens=4 * ps)
    x, y = rig.key(1, 2), rig.key(30, 2)
    rig.insert(x + y)
    rig.insert(x)  # x -> y, both written back below
    rig.evict(100)
    assert rig.tree.match_prefix(x + y).tier_len == len(x + y)
    rig.insert(rig.key(60, 2))
    rig.evict(100)
    # x is as old as y but holds y up: y goes, x stays (in the tier)
    assert rig.tree.match_prefix(x + y).tier_len == len(x)
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_a_tier_copy_whose_copies_below_go_may_go_in_the_same_pass(ps: int) -> None:
    rig = Rig(ps, tier_tokens=4 * ps)
    x, y, z = rig.key(1, 2), rig.key(30, 2), rig.key(60, 4)
    rig.insert(x)
    rig.insert(x + y)  # x is older (a lower id) than y, at the same access time
    rig.evict(100)
    assert rig.tier.available_size() == 0
    rig.insert(z)
    rig.evict(100)  # z needs the whole tier: y goes, then x (now with no copy below)
    assert rig.tree.match_prefix(z).tier_len == len(z)
    assert rig.tree.match_prefix(x + y).cached_len == 0
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_a_leaf_larger_than_the_tier_is_dropped_with_its_tier_subtree(ps: int) -> None:
    rig = Rig(ps, tier_tokens=2 * ps)
    p, q = rig.key(1, 4), rig.key(30, 2)
    full = rig.insert(p + q).indices.clone()
    rig.insert(p)
    assert torch.equal(rig.evict(1), full[len(p) :])  # q goes to the tier (filling it)
    assert rig.tier.available_size() == 0
    assert torch.equal(rig.evict(1), full[: len(p)])  # p cannot be written: dropped, with q
    assert rig.tree.match_prefix(p + q).cached_len == 0
    assert rig.tree.root.children == {} and rig.tier.used_size() == 0
    rig.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_locks_hold_against_the_pool_and_the_tier_eviction(ps: int) -> None:
    rig = Rig(ps, tier_tokens=2 * ps)
    held, other = rig.key(1, 2), rig.key(30, 2)
    rig.insert(held)
    node = rig.tree.match_prefix(held).last_node
    rig.tree.inc_lock_ref(node)
    assert rig.evict(100).numel() == 0  # locked in the pool
    rig.tree.dec_lock_ref(node)
    rig.evict(100)
    rig.tree.inc_lock_ref(node)  # locked in the tier (a swapped-out request's hold)
    rig.insert(other)
    assert rig.evict(100).numel() == len(other)  # no room in the tier: other is dropped
    assert rig.tree.match_prefix(other).cached_len == 0
    assert rig.tree.match_prefix(held).tier_len == len(held)
    rig.check()
    rig.tree.dec_lock_ref(node)
    rig.insert(other)
    rig.evict(100)  # now held's copy may go
    assert rig.tree.match_prefix(held).cached_len == 0
    assert rig.tree.match_prefix(other).tier_len == len(other)
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_splitting_tier_and_dual_nodes_keeps_both_parts(ps: int, policy: str) -> None:
    rig = Rig(ps, policy=policy)
    t_key, dt_key = rig.key(1, 4), rig.key(40, 4)
    rig.insert(t_key)
    rig.evict(100)  # t_key: T
    rig.insert(dt_key)
    if policy == "write_back":  # a copy by eviction, then back into the pool
        rig.evict(100)
        rig.load_back(dt_key)
        rig.tree.dec_lock_ref(rig.tree.match_prefix(dt_key).last_node)
    dt_node = rig.tree.match_prefix(dt_key).last_node
    assert dt_node.value is not None and dt_node.tier_value is not None
    written = rig.tree.num_written_tokens
    for key in (t_key, dt_key):
        match = rig.tree.match_prefix(key[: 2 * ps])  # splits the node in two
        upper = match.last_node
        lower = next(iter(upper.children.values()))
        assert len(upper) == len(lower) == 2 * ps
        for n in (upper, lower):
            assert (n.value is None) == (key is t_key) and n.tier_value is not None
        assert match.tier_len == (2 * ps if key is t_key else 0)
    rig.check()
    rig.check_tier_content()
    assert rig.evict(100).numel() == len(dt_key)  # both halves were copies: freed only
    assert rig.tree.num_written_tokens == written
    prefix = rig.load_back(t_key[: 2 * ps])  # the upper half alone comes back
    assert prefix.numel() == 2 * ps and rig.tree.match_prefix(t_key).tier_len == 2 * ps
    rig.check()
    rig.check_tier_content()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_offload_takes_only_nodes_the_callers_lock_alone_holds(ps: int) -> None:
    rig = Rig(ps)
    a, b, c = rig.key(1, 2), rig.key(20, 2), rig.key(40, 2)
    ab = rig.insert(a + b).indices.clone()
    rig.insert(a)  # a -> b
    node_b = rig.tree.match_prefix(a + b).last_node
    node_a = node_b.parent
    # a second lock on a (another request): only b moves
    rig.tree.inc_lock_ref(node_b)
    rig.tree.inc_lock_ref(node_a)
    assert torch.equal(rig.tree.offload(node_b), ab[len(a) :])
    rig.alloc.free(ab[len(a) :])
    assert node_b.value is None and node_b.lock_ref == 1 and node_a.value is not None
    rig.check()
    rig.tree.dec_lock_ref(node_a)
    rig.tree.dec_lock_ref(node_b)
    # a pool child under a (c) keeps a in the pool
    rig.insert(a + c)
    rig.load_back(a + b)
    rig.alloc.check_integrity(rig.tree.all_values())
    ab = rig.tree.match_prefix(a + b).indices.clone()
    assert torch.equal(rig.tree.offload(node_b), ab[len(a) :])
    rig.alloc.free(ab[len(a) :])
    assert node_a.value is not None
    rig.tree.dec_lock_ref(node_b)
    # with c gone from the pool, one lock on b takes the whole path, bottom up
    rig.evict(len(c))
    assert rig.tree.match_prefix(a + c).tier_len == len(c)
    rig.load_back(a + b)
    ab = rig.tree.match_prefix(a + b).indices.clone()
    freed = rig.tree.offload(node_b)
    assert torch.equal(freed, ab)  # in path order
    rig.alloc.free(freed)
    assert node_a.value is None and node_b.value is None and node_a.lock_ref == 1
    assert rig.tree.protected_size() == 0 and rig.tree.match_prefix(a + b).tier_len == len(a + b)
    rig.check()
    rig.check_tier_content()
    assert rig.evict(100).numel() == 0  # swapped out and locked: nothing to evict anywhere
    rig.tree.dec_lock_ref(node_b)
    rig.check()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_reset_forgets_the_tier(ps: int) -> None:
    rig = Rig(ps)
    rig.insert(rig.key(1, 3))
    rig.insert(rig.key(30, 2))
    rig.evict(1)
    assert rig.tier.used_size() > 0 and rig.tree.total_size() > 0
    rig.alloc.free(rig.tree.all_values())
    rig.tree.reset()
    assert rig.tier.used_size() == 0 and rig.tree.total_size() == 0
    assert rig.tree.match_prefix(rig.key(1, 3)).cached_len == 0
    rig.check()
    rig.insert(rig.key(1, 3))  # the tree and the tier work on
    rig.evict(100)
    assert rig.tree.match_prefix(rig.key(1, 3)).tier_len == 3 * ps
    rig.check()
    rig.check_tier_content()
