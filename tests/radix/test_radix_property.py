"""Stateful property tests: RadixCache against a naive reference of token prefixes, and its KV
events against the tree (a consumer that rebuilds the tree's pages from the events alone sees
exactly what the tree holds, after every step)."""

from __future__ import annotations

import heapq
import itertools

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_event_index import EventIndex, tree_contents

from radixserve.radix import RadixCache
from radixserve.radix.kv_events import KVEventRecorder

EXTRA_KEYS = (None, "salt-a")
# the key forms a caller may pass: the int32 array a request carries (also a strided view of
# one), and a list, an int64 array or a tensor, which the tree converts once
KEY_FORMS = {
    "list": list,
    "int32": lambda key: np.asarray(key, dtype=np.int32),
    "int32-view": lambda key: np.repeat(np.asarray(key, dtype=np.int32), 2)[::2],
    "int64": lambda key: np.asarray(key, dtype=np.int64),
    "tensor": lambda key: torch.tensor(key, dtype=torch.int64),
}


class NaiveReference:
    """Every cached page-aligned prefix ``(extra_key, tokens[:k])`` maps to the slots of its last
    page (``page_size`` of them), so with ``page_size == 1`` each token prefix has one slot."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.slots_of: dict[tuple, tuple[int, ...]] = {}

    def match(self, key: list[int], extra: str | None) -> list[int]:
        out: list[int] = []
        ps = self.page_size
        for end in range(ps, len(key) + 1, ps):
            slots = self.slots_of.get((extra, tuple(key[:end])))
            if slots is None:
                break
            out.extend(slots)
        return out

    def insert(self, key: list[int], slots: list[int], extra: str | None) -> int:
        present = len(self.match(key, extra))
        ps = self.page_size
        for end in range(present + ps, len(key) + 1, ps):
            self.slots_of[(extra, tuple(key[:end]))] = tuple(slots[end - ps : end])
        return present

    def all_slots(self) -> set[int]:
        return {s for slots in self.slots_of.values() for s in slots}

    def num_tokens(self) -> int:
        return len(self.slots_of) * self.page_size


def path_tokens(node: object) -> list[int]:
    """The tokens from the root down to ``node``."""
    runs: list[list[int]] = []
    while node.parent is not None:  # type: ignore[attr-defined]
        runs.append(node.key.tolist())  # type: ignore[attr-defined]
        node = node.parent  # type: ignore[attr-defined]
    return [t for run in reversed(runs) for t in run]


def reference_eviction(tree: RadixCache, num_tokens: int) -> list[int]:
    """The slots ``evict(num_tokens)`` frees, in order, by the plain rule (a heap built afresh
    over the unlocked leaves, ordered by access time then node id; a parent left with no child
    joins it), computed on the side without changing the tree."""
    nodes, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    children_left = {node: len(node.children) for node in nodes}
    heap = [(n.last_access_time, n.id, n) for n in nodes if n is not tree.root]
    heap = [e for e in heap if not e[2].children and e[2].lock_ref == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while len(out) < num_tokens and heap:
        _, _, leaf = heapq.heappop(heap)
        out.extend(leaf.value.tolist())
        parent = leaf.parent
        children_left[parent] -= 1
        if parent is not tree.root and children_left[parent] == 0 and parent.lock_ref == 0:
            heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
    return out


def make_machine(page_size: int, max_len: int):
    keys = st.lists(st.integers(0, 3), min_size=0, max_size=max_len)

    class RadixMachine(RuleBasedStateMachine):
        @initialize()
        def setup(self) -> None:
            self.tree = RadixCache(page_size, KVEventRecorder(page_size))
            self.index = EventIndex()
            self.ref = NaiveReference(page_size)
            self.next_slot = itertools.count(1)
            self.locks: list[tuple[object, str | None, tuple[int, ...]]] = []

        @rule(key=keys, extra=st.sampled_from(EXTRA_KEYS), form=st.sampled_from(list(KEY_FORMS)))
        def insert(self, key: list[int], extra: str | None, form: str) -> None:
            slots = [next(self.next_slot) for _ in key]
            value = torch.tensor(slots, dtype=torch.int64)
            result = self.tree.insert(KEY_FORMS[form](key), value, extra)
            assert result.num_present == self.ref.insert(key, slots, extra)
            # what the insert hands back is what a fresh match sees
            assert result.indices.dtype == torch.int64
            assert result.indices.tolist() == self.ref.match(key, extra)
            aligned = len(key) - len(key) % page_size
            assert len(result.indices) == aligned
            assert path_tokens(result.last_node) == key[:aligned]
            assert result.last_node is self.tree.match_prefix(key, extra).last_node

        @rule(key=keys, extra=st.sampled_from(EXTRA_KEYS), form=st.sampled_from(list(KEY_FORMS)))
        def match(self, key: list[int], extra: str | None, form: str) -> None:
            result = self.tree.match_prefix(KEY_FORMS[form](key), extra)
            assert result.indices.tolist() == self.ref.match(key, extra)
            assert path_tokens(result.last_node) == key[: len(result.indices)]

        @rule(key=keys, extra=st.sampled_from(EXTRA_KEYS))
        def lock(self, key: list[int], extra: str | None) -> None:
            result = self.tree.match_prefix(key, extra)
            self.tree.inc_lock_ref(result.last_node)
            self.locks.append((result.last_node, extra, tuple(key[: len(result.indices)])))

        @precondition(lambda self: self.locks)
        @rule(which=st.integers(0, 1000))
        def unlock(self, which: int) -> None:
            node, _, _ = self.locks.pop(which % len(self.locks))
            self.tree.dec_lock_ref(node)

        @precondition(lambda self: not self.locks)
        @rule()
        def flush(self) -> None:
            self.tree.reset()
            self.ref = NaiveReference(page_size)

        @rule(num_tokens=st.integers(0, 3 * max_len))
        def evict(self, num_tokens: int) -> None:
            before = self.tree.evictable_size()
            leaves = [leaf for leaf in self.tree._leaves if leaf.lock_ref == 0]
            expected = reference_eviction(self.tree, num_tokens)
            freed_in_order = self.tree.evict(num_tokens).tolist()
            assert freed_in_order == expected, "eviction left the plain LRU order"
            freed = set(freed_in_order)
            assert len(freed) >= min(num_tokens, before)
            locked = {s for key in self.locked_prefixes() for s in self.ref.slots_of[key]}
            assert not freed & locked, "a locked prefix was evicted"
            evicted = [leaf for leaf in leaves if set(leaf.value.tolist()) <= freed]
            kept = [leaf for leaf in leaves if not set(leaf.value.tolist()) & freed]
            if evicted and kept:
                assert max(leaf.last_access_time for leaf in evicted) <= min(
                    leaf.last_access_time for leaf in kept
                ), "a more recently used leaf was evicted before a colder one"
            assert freed <= self.ref.all_slots()
            gone = {k for k, slots in self.ref.slots_of.items() if set(slots) & freed}
            assert all(set(self.ref.slots_of[k]) <= freed for k in gone), "half a page was evicted"
            self.ref.slots_of = {k: s for k, s in self.ref.slots_of.items() if k not in gone}
            # eviction removes leaves only: the reference stays prefix-closed
            ps = self.ref.page_size
            for extra, prefix in self.ref.slots_of:
                if len(prefix) > ps:
                    assert (extra, prefix[:-ps]) in self.ref.slots_of

        def locked_prefixes(self) -> set[tuple]:
            ps = self.ref.page_size
            return {(e, p[:end]) for _, e, p in self.locks for end in range(ps, len(p) + 1, ps)}

        @invariant()
        def events_rebuild_the_tree(self) -> None:
            self.index.apply_events(self.tree.events.take())
            assert self.index.contents() == tree_contents(self.tree)

        @invariant()
        def sizes_add_up(self) -> None:
            self.tree.check_integrity()
            total = self.ref.num_tokens()
            assert self.tree.total_size() == total
            num_locked = len(self.locked_prefixes()) * self.ref.page_size
            assert self.tree.protected_size() == num_locked
            assert self.tree.evictable_size() == total - num_locked

    return RadixMachine


@pytest.mark.parametrize(("page_size", "max_len"), [(1, 12), (4, 24), (16, 64)])
def test_radix_cache_matches_reference(page_size: int, max_len: int) -> None:
    machine = make_machine(page_size, max_len)
    machine.TestCase.settings = settings(
        max_examples=60,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
