"""Router policies route as sglang-router documents them, and ``cache_aware_events`` as smg's
event-driven selection does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixserve.radix import RadixCache
from radixserve.radix.kv_events import KVEventRecorder
from radixserve.sim.router import CacheAwareConfig, Router


def _ids(*parts: tuple[int, int]) -> np.ndarray:
    return np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in parts])


def test_round_robin_takes_turns() -> None:
    r = Router("round_robin", 3)
    assert [r.pick(_ids((0, 5)), 0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert r.loads == [3, 2, 2]


def test_power_of_two_picks_the_less_loaded_of_two() -> None:
    r = Router("power_of_two", 2, seed=1)
    r.loads = [10, 0]
    assert all(r.pick(_ids((0, 5)), 0.0) == 1 for _ in range(10))  # 1 stays below 10
    r3 = Router("power_of_two", 3, seed=2)
    r3.loads = [0, 100, 100]
    picks = [r3.pick(_ids((0, 5)), 0.0) for _ in range(30)]
    # replica 0 wins every draw it is in; a draw of 1 and 2 goes to either
    assert picks.count(0) >= 15 and set(picks) <= {0, 1, 2}


def test_cache_aware_follows_the_prefix_then_the_smallest_tree() -> None:
    r = Router("cache_aware", 2)
    system = (1000, 1100)
    first = r.pick(_ids(system, (0, 10)), 0.0)
    assert first == 0  # empty trees: the smallest (the first)
    other = r.pick(_ids((5000, 5100)), 0.0)
    assert other == 1  # no match above the threshold: the smaller tree
    # 100 of 110 tokens match replica 0's tree: rate 0.91 > 0.3
    assert [r.pick(_ids(system, (20 + 10 * i, 30 + 10 * i)), 0.0) for i in range(5)] == [0] * 5
    assert r.num_cache_routed == 5
    # a match of 10 out of 100 (0.1) is not enough: the smallest tree (replica 1: 100 tokens)
    assert r.pick(_ids((1000, 1010), (7000, 7090)), 0.0) == 1


def test_cache_aware_balances_when_both_thresholds_are_passed() -> None:
    cfg = CacheAwareConfig(balance_abs_threshold=4, balance_rel_threshold=2.0)
    r = Router("cache_aware", 2, cfg)
    system = (1000, 1100)
    r.pick(_ids(system, (0, 10)), 0.0)
    r.loads = [6, 1]  # 6 - 1 > 4 and 6 > 2 * 1: imbalanced -> the least loaded, despite the match
    assert r.pick(_ids(system, (50, 60)), 0.0) == 1
    assert r.num_balance_routed == 1
    r.loads = [5, 2]  # 5 - 2 = 3, not > 4: the cache decides
    assert r.pick(_ids(system, (70, 80)), 0.0) == 0


def test_cache_aware_evicts_trees_past_max_tree_size_every_interval() -> None:
    r = Router("cache_aware", 2, CacheAwareConfig(max_tree_size=150, eviction_interval_secs=10))
    for i in range(4):
        r.pick(_ids((100 * i + 1000, 100 * i + 1100)), 0.0)
    assert sum(t.total_size() for t in r._trees) == 400
    r.pick(_ids((9000, 9001)), 11.0)  # past the interval: each tree cut to <= 150, then insert
    assert all(t.total_size() <= 151 for t in r._trees)


def test_done_lowers_the_load_and_bad_input_is_refused() -> None:
    r = Router("round_robin", 2)
    r.pick(_ids((0, 3)), 0.0)
    r.done(0)
    assert r.loads == [0, 0]
    with pytest.raises(ValueError, match="router policy"):
        Router("random_walk", 2)
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareConfig(cache_threshold=1.5)


def test_cache_aware_events_follows_what_replicas_report() -> None:
    r = Router("cache_aware_events", 3)
    trees = [RadixCache(1, KVEventRecorder(1)) for _ in range(3)]
    system = _ids((1000, 1100))
    assert r.pick(system, 0.0) == 0  # nothing reported yet: the least loaded, the first
    trees[2].insert(system, torch.arange(100))  # replica 2 reports the system prompt
    r.observe(2, trees[2].events.take())
    assert r.pick(_ids((1000, 1100), (0, 5)), 0.0) == 2  # any overlap counts, no threshold
    trees[1].insert(_ids((1000, 1010)), torch.arange(10))
    r.observe(1, trees[1].events.take())
    assert r.pick(_ids((1000, 1100), (5, 9)), 0.0) == 2  # the longer run of leading pages
    trees[2].evict(100)  # replica 2 evicted it: the router hears so
    r.observe(2, trees[2].events.take())
    assert r.pick(_ids((1000, 1100), (9, 12)), 0.0) == 1  # now only replica 1's 10 tokens
    trees[2].reset()
    r.observe(2, trees[2].events.take())
    assert r._held[2] == {}
    assert r.num_cache_routed == 3


def test_cache_aware_events_balances_and_breaks_ties_by_load() -> None:
    r = Router("cache_aware_events", 2, CacheAwareConfig(balance_abs_threshold=4))
    trees = [RadixCache(1, KVEventRecorder(1)) for _ in range(2)]
    for i, tree in enumerate(trees):
        tree.insert(_ids((0, 50)), torch.arange(50))
        r.observe(i, tree.events.take())
    r.loads = [3, 1]
    assert r.pick(_ids((0, 60)), 0.0) == 1  # equal runs: the lower load
    r.loads = [10, 1]  # 10 - 1 > 4 and 10 > 1.5: imbalanced
    assert r.pick(_ids((0, 60)), 0.0) == 1 and r.num_balance_routed == 1
