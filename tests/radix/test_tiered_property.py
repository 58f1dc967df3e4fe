"""Stateful property test: TieredRadixCache over a real pool and a file tier, against a naive
reference of what each token prefix's K/V must be.

Every token a rule computes gets the K/V ``token_kv(extra, prefix)`` written into its pool slots
before the insert, so whatever the tree hands back (a match's pool slots, its tier slots, the
slots a load-back fills, a restarted tree's tier part) can be compared with the reference. The
reference also records which page-aligned prefixes were ever inserted: a match never reaches
past them. ``check_integrity`` (pool tree, tier partition, LRU entries) runs after every step.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_event_index import EventIndex, tree_contents
from tier_helpers import compute, expected_kv, new_pool, path_of, path_tokens, pool_kv, tier_kv

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_cache import KVCache
from radixserve.memory_pool.kv_tier import INDEX, TierLayout, file_tier
from radixserve.radix.kv_events import DISK, KVEventRecorder
from radixserve.radix.tier_index import restore_index, save_index
from radixserve.radix.tiered_cache import TieredRadixCache
from radixserve.radix.tree_node import TreeNode

EXTRA_KEYS = (None, "salt")
MODEL_KEY = "tiny@property"


def _poison(kv: KVCache, slots: torch.Tensor) -> None:
    """Slots that change hands hold NaN until written: a stale read cannot pass as right."""
    for layer in range(kv.num_layers):
        for t in kv.get_kv(layer):
            t[slots] = float("nan")


def key_strategy(ps: int, max_len: int) -> st.SearchStrategy[list[int]]:
    """Keys that share prefixes often: a prefix of one of three fixed documents (two share
    their first half), then a short random tail; and now and then a random key."""
    half = max_len // 2
    docs = [
        list(range(10, 10 + max_len)),
        list(range(10, 10 + half)) + list(range(40, 40 + max_len - half)),
        list(range(70, 70 + max_len)),
    ]
    shared = st.builds(
        lambda doc, n, tail: docs[doc][:n] + tail,
        st.integers(0, len(docs) - 1),
        st.integers(0, max_len),
        st.lists(st.integers(0, 2), max_size=ps + 1),
    )
    return st.one_of(shared, st.lists(st.integers(0, 2), max_size=max_len))


def make_machine(ps: int, max_len: int, pool_tokens: int, tier_tokens: int, policy: str):
    keys = key_strategy(ps, max_len)

    class TieredMachine(RuleBasedStateMachine):
        @initialize()
        def setup(self) -> None:
            self.dir = Path(tempfile.mkdtemp(prefix="tier-prop-"))
            self.inserted: set[tuple[str | None, tuple[int, ...]]] = set()
            self.keys: list[tuple[list[int], str | None]] = []  # as inserted, for the lock rule
            self.locks: list[tuple[TreeNode, str | None, list[int]]] = []
            assert not self._open()

        def teardown(self) -> None:
            shutil.rmtree(self.dir, ignore_errors=True)

        def _open(self) -> bool:
            """A fresh pool and tree over the file tier in ``self.dir``; whether it reopened."""
            self.kv = new_pool(pool_tokens + ps)
            self.alloc = TokenToKVPoolAllocator(pool_tokens + ps, ps)
            layout = TierLayout.of(self.kv, ps)
            self.tier, reopened = file_tier(self.dir, layout, tier_tokens, MODEL_KEY)
            self.tree = TieredRadixCache(ps, self.tier, self.kv, policy, KVEventRecorder(ps))
            self.index = EventIndex()  # a new engine: its consumer starts afresh
            return reopened

        # ---- checks against the reference ------------------------------------------------
        def check_path(self, node: TreeNode, extra: str | None) -> None:
            """Every node from the root to ``node`` holds its prefix's K/V where it says it does
            (pool and tier copy alike), and every prefix on the way was inserted."""
            tokens: list[int] = []
            for n in path_of(node):
                start = len(tokens)
                tokens += n.key.tolist()
                want = expected_kv(tokens, start, len(tokens), extra)
                if n.value is not None:
                    assert torch.equal(pool_kv(self.kv, n.value), want), "pool K/V is wrong"
                if n.tier_value is not None:
                    assert torch.equal(tier_kv(self.tier, n.tier_value), want), "tier K/V is wrong"
            for end in range(ps, len(tokens) + 1, ps):
                assert (extra, tuple(tokens[:end])) in self.inserted, "a match past the inserts"

        def tree_nodes(self) -> list[TreeNode]:
            return [n for n in self.tree._nodes() if n is not self.tree.root]

        # ---- rules -----------------------------------------------------------------------
        @rule(key=keys, extra=st.sampled_from(EXTRA_KEYS))
        def insert(self, key: list[int], extra: str | None) -> None:
            slots = compute(self.kv, self.alloc, self.tree, key, extra)
            if slots is None:
                return  # the pool is locked full
            result = self.tree.insert(key, slots, extra)
            aligned = len(key) - len(key) % ps
            for end in range(ps, aligned + 1, ps):
                self.inserted.add((extra, tuple(key[:end])))
            self.keys.append((key, extra))
            self.alloc.free(slots[: result.num_present])
            self.alloc.free(slots[aligned:])
            _poison(self.kv, slots[: result.num_present])
            assert len(result.indices) == aligned
            match = self.tree.match_prefix(key, extra)
            # after an insert the whole key is in the pool (tier-only nodes took the slots)
            assert match.tier_len == 0 and torch.equal(match.indices, result.indices)
            assert torch.equal(pool_kv(self.kv, match.indices), expected_kv(key, 0, aligned, extra))
            self.check_path(match.last_node, extra)

        @rule(key=keys, extra=st.sampled_from(EXTRA_KEYS))
        def match(self, key: list[int], extra: str | None) -> None:
            m = self.tree.match_prefix(key, extra)
            assert path_tokens(m.last_node) == key[: m.cached_len]
            assert m.cached_len % ps == 0 and m.cached_len <= len(key)
            n_pool = len(m.indices)
            assert torch.equal(pool_kv(self.kv, m.indices), expected_kv(key, 0, n_pool, extra))
            self.check_path(m.last_node, extra)
            now = self.tree.prefix_of(m.last_node)  # what KVManager._adopt reads at commit
            assert torch.equal(now.indices, m.indices) and now.tier_len == m.tier_len

        @rule(num_tokens=st.integers(0, 2 * max_len))
        def evict(self, num_tokens: int) -> None:
            before = self.tree.evictable_size()
            locked = [n.value for n in self.tree_nodes() if n.lock_ref and n.value is not None]
            freed = self.tree.evict(num_tokens)
            assert len(freed) >= min(num_tokens, before)
            held = set(torch.cat(locked).tolist()) if locked else set()
            assert not set(freed.tolist()) & held, "a locked node's pool slots were evicted"
            self.alloc.free(freed)
            _poison(self.kv, freed)
            for _, extra, tokens in self.locks:
                assert self.tree.match_prefix(tokens, extra).cached_len == len(tokens)

        @precondition(lambda self: self.keys)
        @rule(which=st.integers(0, 1000), cut=st.integers(0, max_len))
        def lock_and_load_back(self, which: int, cut: int) -> None:
            """A request admitted with a match of (a prefix of) an inserted key: it locks the
            match and loads its tier part back into slots it allocates (evicting if short)."""
            key, extra = self.keys[which % len(self.keys)]
            key = key[: len(key) - cut % (len(key) + 1)]
            m = self.tree.match_prefix(key, extra)
            self.tree.inc_lock_ref(m.last_node)
            tokens = key[: m.cached_len]
            self.locks.append((m.last_node, extra, tokens))
            if not m.tier_len:
                return
            slots = self.alloc.alloc(m.tier_len)
            if slots is None:
                freed = self.tree.evict(m.tier_len)
                self.alloc.free(freed)
                _poison(self.kv, freed)
                slots = self.alloc.alloc(m.tier_len)
                if slots is None:
                    return  # no room: the lock keeps the tier part (a swapped-out request)
            _poison(self.kv, slots)
            self.tree.load_back(m.last_node, slots)
            after = self.tree.match_prefix(tokens, extra)
            assert after.tier_len == 0 and after.last_node is m.last_node
            assert torch.equal(after.indices[len(m.indices) :], slots)
            assert torch.equal(
                pool_kv(self.kv, after.indices), expected_kv(key, 0, len(tokens), extra)
            )

        @precondition(lambda self: self.keys)
        @rule(which=st.integers(0, 1000), cut=st.integers(0, max_len))
        def two_admissions(self, which: int, cut: int) -> None:
            """Two requests of one batch planned with the same match (both locked), adopted one
            after the other as ``KVManager._adopt`` does: the second finds the tier part loaded
            by the first (``prefix_of``) and loads nothing."""
            key, extra = self.keys[which % len(self.keys)]
            key = key[: len(key) - cut % (len(key) + 1)]
            plans = [self.tree.match_prefix(key, extra) for _ in range(2)]
            for m in plans:
                self.tree.inc_lock_ref(m.last_node)
                self.locks.append((m.last_node, extra, key[: m.cached_len]))
            loaded_before = self.tree.num_loaded_tokens
            for i, m in enumerate(plans):
                now = self.tree.prefix_of(m.last_node)
                assert now.cached_len == m.cached_len and now.last_node is m.last_node
                if i == 1:
                    assert now.tier_len == 0 or now.tier_len == m.tier_len  # (no room for it)
                if now.tier_len:
                    slots = self.alloc.alloc(now.tier_len)
                    if slots is None:
                        continue
                    _poison(self.kv, slots)
                    self.tree.load_back(now.last_node, slots)
                prefix = self.tree.prefix_of(m.last_node)
                assert prefix.tier_len == 0 and prefix.cached_len == m.cached_len
                assert torch.equal(
                    pool_kv(self.kv, prefix.indices), expected_kv(key, 0, m.cached_len, extra)
                )
            assert self.tree.num_loaded_tokens - loaded_before <= plans[0].tier_len

        @precondition(lambda self: self.locks)
        @rule(which=st.integers(0, 1000))
        def unlock(self, which: int) -> None:
            node, _, _ = self.locks.pop(which % len(self.locks))
            self.tree.dec_lock_ref(node)

        @precondition(lambda self: self.locks)
        @rule(which=st.integers(0, 1000))
        def offload(self, which: int) -> None:
            """Swap out the pool part of a locked prefix (``KVManager.swap_out``)."""
            node, extra, tokens = self.locks[which % len(self.locks)]
            path = path_of(node)
            before = [(n, n.value, n.lock_ref) for n in path]
            freed = self.tree.offload(node)
            moved = [(n, v, lock) for n, v, lock in before if v is not None and n.value is None]
            assert all(lock == 1 for _, _, lock in moved), "offload took a shared node"
            pool_nodes = [n for n, v, _ in before if v is not None]
            bottom = pool_nodes[len(pool_nodes) - len(moved) :]
            assert [n for n, _, _ in moved] == bottom, "offload moves the bottom of the pool part"
            want = torch.cat([v for _, v, _ in moved]) if moved else freed[:0]
            assert torch.equal(freed, want), "offload returns the moved slots in path order"
            self.alloc.free(freed)
            _poison(self.kv, freed)
            assert self.tree.match_prefix(tokens, extra).cached_len == len(tokens)
            self.check_path(node, extra)

        @rule(key=keys, extra=st.sampled_from(EXTRA_KEYS))
        def swap_out(self, key: list[int], extra: str | None) -> None:
            """``KVManager.swap_out``: a request that computed ``key`` is cached, then its own
            nodes move to the tier, held there by its lock until it comes back."""
            self.insert(key, extra)
            m = self.tree.match_prefix(key, extra)
            if m.last_node is self.tree.root:
                return
            self.tree.inc_lock_ref(m.last_node)
            self.locks.append((m.last_node, extra, key[: m.cached_len]))
            self.offload(len(self.locks) - 1)

        def _restart(self, save: bool) -> None:
            # saving first writes the pool's nodes back to the tier: read what it saved after
            num_saved = save_index(self.tree) if save else 0
            saved: dict[tuple[str | None, tuple[int, ...]], int] = {}
            stack = [(c, []) for c in self.tree.root.children.values()]
            while stack:  # what the index holds: tier copies reachable through tier copies
                n, above = stack.pop()
                if n.tier_value is None:
                    continue
                tokens = above + n.key.tolist()
                saved[(n.extra_key, tuple(tokens))] = len(n)
                stack.extend((c, tokens) for c in n.children.values())
            if save:
                assert num_saved == len(saved)
            had_index = (self.dir / INDEX).exists()
            self.locks = []  # the requests die with the server
            del self.tree, self.tier
            assert self._open(), "the same model's tier is reopened"
            restored = restore_index(self.tree)
            assert not (self.dir / INDEX).exists()
            if save:
                assert restored == sum(saved.values())
            assert had_index or restored == 0
            found = {}
            for n in self.tree_nodes():
                assert n.value is None and n.tier_value is not None
                found[(n.extra_key, tuple(path_tokens(n)))] = len(n)
                self.check_path(n, n.extra_key)
            if save:
                assert found == saved, "the restarted tree is not the one saved"
            self.alloc.check_integrity(torch.empty(0, dtype=torch.int64))

        @rule()
        def save(self) -> None:
            """What the server does when idle: the index of the tier as it is now (any later
            tier write deletes it again)."""
            save_index(self.tree)
            assert (self.dir / INDEX).exists()

        @rule(clean=st.booleans())
        def restart(self, clean: bool) -> None:
            """A new server over the same file tier: after a clean shutdown (``save_index``),
            or after a crash, where an index left from an earlier save is served only if no
            tier write made it stale, so whatever comes back must hold the right K/V."""
            self._restart(save=clean)

        @invariant()
        def integrity(self) -> None:
            if not hasattr(self, "tree"):
                return
            self.index.apply_events(self.tree.events.take())
            assert self.index.contents() == tree_contents(self.tree, DISK), "events differ"
            self.tree.check_integrity()
            self.alloc.check_integrity(self.tree.all_values())
            for node, _, tokens in self.locks:
                assert path_tokens(node) == tokens and node.lock_ref > 0

    return TieredMachine


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
@pytest.mark.parametrize(
    ("ps", "max_len", "pool_tokens", "tier_tokens"), [(1, 10, 16, 16), (4, 20, 32, 32)]
)
def test_tiered_cache_matches_reference(
    ps: int,
    max_len: int,
    pool_tokens: int,
    tier_tokens: int,
    policy: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # durability is not what this checks: a restart here reopens the file in the same process
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    machine = make_machine(ps, max_len, pool_tokens, tier_tokens, policy)
    machine.TestCase.settings = settings(
        max_examples=80,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
