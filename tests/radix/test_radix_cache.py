from __future__ import annotations

import torch

from radixserve.radix import NoPrefixCache, RadixCache


def t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def test_match_splits_a_node_on_partial_hit() -> None:
    tree = RadixCache()
    assert tree.insert([1, 2, 3, 4], t(10, 11, 12, 13)).num_present == 0
    result = tree.match_prefix([1, 2, 9])
    assert result.indices.tolist() == [10, 11]
    assert result.last_node.key.tolist() == [1, 2]
    assert tree.insert([1, 2, 3, 4, 5], t(20, 21, 22, 23, 24)).num_present == 4
    assert tree.match_prefix([1, 2, 3, 4, 5, 6]).indices.tolist() == [10, 11, 12, 13, 24]
    tree.check_integrity()


def test_insert_returns_what_a_match_would() -> None:
    tree = RadixCache()
    first = tree.insert([1, 2, 3, 4], t(10, 11, 12, 13))
    assert (first.num_present, first.indices.tolist()) == (0, [10, 11, 12, 13])
    assert first.last_node.key.tolist() == [1, 2, 3, 4]
    second = tree.insert([1, 2, 7], t(20, 21, 22))  # splits [1, 2 | 3, 4], adds [7]
    assert (second.num_present, second.indices.tolist()) == (2, [10, 11, 22])
    assert second.last_node.key.tolist() == [7]
    inside = tree.insert([1, 2, 3], t(30, 31, 32))  # ends inside [3, 4]: splits it, adds nothing
    assert (inside.num_present, inside.indices.tolist()) == (3, [10, 11, 12])
    assert inside.last_node is tree.match_prefix([1, 2, 3]).last_node
    assert inside.last_node.key.tolist() == [3]
    tree.check_integrity()


def test_eviction_is_lru_over_unlocked_leaves() -> None:
    tree = RadixCache()
    tree.insert([1, 1], t(1, 2))
    tree.insert([2, 2], t(3, 4))
    tree.insert([3, 3], t(5, 6))
    tree.match_prefix([1, 1])  # [1, 1] is now the most recent
    locked = tree.match_prefix([2, 2]).last_node
    tree.inc_lock_ref(locked)
    assert tree.evict(1).tolist() == [5, 6]  # [3, 3] is the coldest unlocked leaf
    assert tree.evict(10).tolist() == [1, 2]  # [2, 2] is locked
    assert tree.total_size() == tree.protected_size() == 2
    tree.dec_lock_ref(locked)
    assert tree.evictable_size() == 2
    tree.check_integrity()


def test_parents_become_leaves_after_eviction() -> None:
    tree = RadixCache()
    tree.insert([1, 2, 3], t(1, 2, 3))
    tree.insert([1, 2, 4], t(1, 2, 4))
    freed = tree.evict(3)
    assert sorted(freed.tolist()) == [1, 2, 3, 4]
    assert tree.total_size() == 0
    tree.check_integrity()


def test_extra_keys_never_share_nodes() -> None:
    tree = RadixCache()
    tree.insert([1, 2, 3], t(1, 2, 3), extra_key="a")
    assert tree.match_prefix([1, 2, 3]).indices.numel() == 0
    assert tree.match_prefix([1, 2, 3], extra_key="b").indices.numel() == 0
    assert tree.insert([1, 2, 3], t(7, 8, 9)).num_present == 0
    assert tree.match_prefix([1, 2, 3], extra_key="a").indices.tolist() == [1, 2, 3]
    assert tree.match_prefix([1, 2, 3]).indices.tolist() == [7, 8, 9]
    tree.check_integrity()


def test_page_size_truncates_keys_to_whole_pages() -> None:
    tree = RadixCache(page_size=4)
    assert tree.insert(list(range(10)), torch.arange(100, 110)).num_present == 0
    assert tree.total_size() == 8
    assert tree.match_prefix(list(range(7))).indices.tolist() == [100, 101, 102, 103]
    assert tree.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).indices.tolist() == [100, 101, 102, 103]
    tree.check_integrity()


def test_lock_moves_sizes_between_evictable_and_protected() -> None:
    tree = RadixCache()
    tree.insert([1, 2, 3], t(1, 2, 3))
    node = tree.match_prefix([1, 2]).last_node
    assert tree.inc_lock_ref(node) == -2
    assert (tree.evictable_size(), tree.protected_size()) == (1, 2)
    assert tree.inc_lock_ref(node) == 0
    assert tree.dec_lock_ref(node) == 0
    assert tree.dec_lock_ref(node) == 2
    tree.check_integrity()


def test_reset_and_pretty_print() -> None:
    tree = RadixCache()
    tree.insert([5, 6, 7], t(1, 2, 3))
    assert "len=3" in tree.pretty_print()
    assert sorted(tree.all_values().tolist()) == [1, 2, 3]
    tree.reset()
    assert tree.total_size() == 0 and tree.match_prefix([5]).indices.numel() == 0


def test_simulated_tree_stores_tokens_as_values() -> None:
    tree = RadixCache.create_simulated()
    tree.insert([4, 5, 6], t(4, 5, 6))
    assert len(tree.match_prefix([4, 5, 6, 7]).indices) == 3


def test_no_prefix_cache_is_a_null_object() -> None:
    cache = NoPrefixCache()
    assert cache.is_disabled
    assert cache.insert([1, 2], t(5, 6)).num_present == 2  # takes nothing: the caller frees it all
    result = cache.match_prefix([1, 2])
    assert result.indices.numel() == 0
    assert cache.inc_lock_ref(result.last_node) == 0 and cache.evict(5).numel() == 0
    assert cache.total_size() == 0
    paged = NoPrefixCache(page_size=4)
    result = paged.insert(list(range(6)), torch.arange(6))
    assert result.num_present == 4 and result.indices.numel() == 0
    assert result.last_node is paged.root
