"""RadixCache: a radix tree from token prefixes to KV slots, with LRU eviction and lock refs."""

from __future__ import annotations

import heapq
import itertools
import struct

import numpy as np
import torch

from radixserve.radix.base import InsertResult, MatchResult, TokenKey
from radixserve.radix.tree_node import TreeNode
from radixserve.radix.tree_observer import POOL, TreeObserver, with_observer

_EMPTY_VALUE = torch.empty(0, dtype=torch.int64)
_INT32 = np.dtype(np.int32)
_TOKEN_BYTES = _INT32.itemsize


def _key_bytes(key: TokenKey) -> bytes:
    """The key's int32 tokens as bytes: one memcpy for the int32 ndarray a request carries,
    a conversion (once per call) for a list or a tensor."""
    if type(key) is np.ndarray and key.dtype is _INT32:
        return key.tobytes()
    if isinstance(key, list | tuple):  # struct packs a list 2.5x faster than numpy converts it
        return struct.pack(f"{len(key)}i", *key)
    if isinstance(key, torch.Tensor):
        return key.to(torch.int32).cpu().numpy().tobytes()
    return np.asarray(key, dtype=np.int32).tobytes()


def _cat(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(values) if len(values) > 1 else (values[0] if values else _EMPTY_VALUE)


class RadixCache:
    """The prefix cache of docs/design.md, "The radix cache contract" (:class:`PrefixCache`).

    Sizes are kept incrementally: ``evictable_size`` counts pool tokens of unlocked nodes,
    ``protected_size`` of locked ones. ``_leaves`` are the nodes the pool's eviction may take:
    those with no child in the pool (here every child is; ``TieredRadixCache`` keeps nodes whose
    KV is in the tier only). Access times come from a logical clock, so LRU order is
    deterministic. Eviction pops a heap kept across calls (``_lru``, lazily invalidated): every
    unlocked leaf has an entry with its current access time, stale entries are skipped when
    popped, and the heap is rebuilt when stale ones outnumber the leaves. Values are opaque:
    with ``create_simulated()`` they may be the tokens themselves (the policy's in-batch check
    uses such a tree, never the real one). ``events`` (None: off) hears of every node that
    enters or leaves the pool, and of every split (``radix/tree_observer.py``).
    """

    def __init__(self, page_size: int = 1, events: TreeObserver | None = None) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if events is not None and events.page_size != page_size:
            raise ValueError(
                f"events of {events.page_size}-token pages under a tree of {page_size}"
            )
        self.page_size = page_size
        self.events: TreeObserver | None = events
        self._page_bytes = page_size * _TOKEN_BYTES
        self._clock = itertools.count(1)
        self._node_ids = itertools.count()
        self.reset()

    @classmethod
    def create_simulated(cls, page_size: int = 1) -> RadixCache:
        """A tree with no pool behind it: insert ``(tokens, tokens)`` and read match lengths."""
        return cls(page_size)

    @property
    def is_disabled(self) -> bool:
        return False

    def add_observer(self, observer: TreeObserver) -> None:
        """From now on ``observer`` hears of every node entering or leaving a medium too."""
        if observer.page_size != self.page_size:
            raise ValueError(f"an observer of {observer.page_size}-token pages")
        self.events = with_observer(self.events, observer)

    @property
    def root(self) -> TreeNode:
        return self._root

    # ---- queries -------------------------------------------------------------------------
    def match_prefix(self, key: TokenKey, extra_key: str | None = None) -> MatchResult:
        node, _, values = self._walk(_key_bytes(key), extra_key)
        return MatchResult(_cat(values), node)

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def all_values(self) -> torch.Tensor:
        """Every pool slot the tree holds (a node in the tier only holds none)."""
        values = [n.value for n in self._nodes() if n is not self._root and n.value is not None]
        return torch.cat(values) if values else _EMPTY_VALUE

    # ---- commits -------------------------------------------------------------------------
    def insert(
        self, key: TokenKey, value: torch.Tensor, extra_key: str | None = None
    ) -> InsertResult:
        key_bytes, node, pos, values = self._walk_to_insert(key, value, extra_key)
        return self._insert_after_walk(node, pos, values, key_bytes, value, extra_key, pos)

    def _walk_to_insert(
        self, key: TokenKey, value: torch.Tensor, extra_key: str | None
    ) -> tuple[bytes, TreeNode, int, list[torch.Tensor]]:
        """The key's bytes (its length checked against ``value``'s) and its walk."""
        key_bytes = _key_bytes(key)
        num_tokens = value.shape[0]  # len() of a tensor costs 6x more
        if len(key_bytes) != num_tokens * _TOKEN_BYTES:
            raise ValueError(
                f"key ({len(key_bytes) // _TOKEN_BYTES}) and value ({num_tokens}) lengths differ"
            )
        return (key_bytes, *self._walk(key_bytes, extra_key))

    def _insert_after_walk(
        self,
        node: TreeNode,
        pos: int,
        values: list[torch.Tensor],
        key_bytes: bytes,
        value: torch.Tensor,
        extra_key: str | None,
        num_present: int,
    ) -> InsertResult:
        """Hang ``key[pos:]`` (whole pages) under ``node``, where a walk of ``key`` ended."""
        num_tokens = value.shape[0]
        end = num_tokens - num_tokens % self.page_size
        if pos < end:
            leaf = TreeNode(
                next(self._node_ids),
                key_bytes[pos * _TOKEN_BYTES : end * _TOKEN_BYTES],
                value[pos:end].clone(),
                node,
                extra_key,
                node.last_access_time,
            )
            node.children[self._child_key(node, extra_key, leaf.key_bytes)] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self._push_lru(leaf)
            self._evictable_size += len(leaf)
            if self.events is not None:
                self.events.stored(leaf, POOL)
            values.append(leaf.value)  # type: ignore[arg-type]  # (just set)
            node = leaf
        return InsertResult(num_present, _cat(values), node)

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Free unlocked leaves, least recently used first (ties: oldest node), until
        ``num_tokens`` are freed or none is left (what becomes of each: ``_evict_leaf``)."""
        leaves = self._leaves
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens and self._lru:
            t, _, leaf = heapq.heappop(self._lru)
            if leaf.lock_ref or t != leaf.last_access_time or leaf not in leaves:
                continue  # stale: locked, touched since, or no longer a leaf in the tree
            freed.append(leaf.value)  # type: ignore[arg-type]  # (in the pool)
            num_freed += len(leaf)
            self._evict_leaf(leaf)
        self._evictable_size -= num_freed
        return torch.cat(freed) if freed else _EMPTY_VALUE

    def _evict_leaf(self, leaf: TreeNode) -> None:
        """The pool took ``leaf``'s slots: it leaves the tree; a parent left a leaf joins the
        order."""
        if self.events is not None:
            self.events.removed(leaf, POOL)
        parent = self._delete_leaf(leaf)
        if parent is not self._root and parent.is_leaf:
            self._push_lru(parent)

    def inc_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self._root:
            if node.lock_ref == 0 and node.value is not None:  # sizes count pool tokens only
                delta -= len(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self._root:
            assert node.lock_ref > 0, "dec_lock_ref on an unlocked node"
            if node.lock_ref == 1:
                if node.value is not None:  # sizes count pool tokens only
                    delta += len(node)
                unlocked_leaf = node in self._leaves
            else:
                unlocked_leaf = False
            node.lock_ref -= 1
            if unlocked_leaf:  # it joins the eviction order
                self._push_lru(node)
            node = node.parent  # type: ignore[assignment]
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def reset(self) -> None:
        if self.events is not None and hasattr(self, "_root"):
            self.events.all_cleared()
        self._root = TreeNode(next(self._node_ids), b"", _EMPTY_VALUE, None)
        self._root.lock_ref = 1  # the root is never evicted
        self._leaves: set[TreeNode] = set()
        # (access time, id, node) of unlocked leaves, possibly stale; tuples compare in C
        self._lru: list[tuple[int, int, TreeNode]] = []
        self._evictable_size = 0
        self._protected_size = 0

    # ---- checks and views ----------------------------------------------------------------
    def check_integrity(self, unique_values: bool = True) -> None:
        """Sizes add up, lock refs are consistent, every value matches its key's length, the
        leaf set is exact, and (``unique_values``) no KV slot sits in two nodes."""
        evictable = protected = 0
        leaves: set[TreeNode] = set()
        for node in self._nodes():
            if node is self._root:
                continue
            assert len(node.key) > 0, "a non-root node has an empty key"
            for v in (node.value, node.tier_value):
                assert v is None or len(node.key_bytes) == len(v) * _TOKEN_BYTES, (
                    "key, value differ"
                )
            assert node.value is not None or node.tier_value is not None, "a node holds no KV"
            assert len(node.key) % self.page_size == 0, "a key is not a whole number of pages"
            assert (
                node.parent is not None
                and node.parent.children.get(
                    self._child_key(node.parent, node.extra_key, node.key_bytes)
                )
                is node
            ), "a node is not where its parent says"
            if node.parent is not self._root:
                assert node.extra_key == node.parent.extra_key, "extra keys share a path"
            child_locks = sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= child_locks, "a node is locked less than its children"
            if node.value is None:
                pass  # in the tier only: no pool tokens
            elif node.lock_ref == 0:
                evictable += len(node)
            else:
                protected += len(node)
            if node.value is not None and all(c.value is None for c in node.children.values()):
                leaves.add(node)  # no child in the pool: the pool's eviction may take it
        assert evictable == self._evictable_size, f"evictable {self._evictable_size} != {evictable}"
        assert protected == self._protected_size, f"protected {self._protected_size} != {protected}"
        assert leaves == self._leaves, "the leaf set is stale"
        current = {n for t, _, n in self._lru if t == n.last_access_time}
        assert all(n in current for n in leaves if n.lock_ref == 0), "an LRU entry is missing"
        if unique_values:
            values = self.all_values()
            assert len(torch.unique(values)) == len(values), "a KV slot is held by two nodes"

    def pretty_print(self) -> str:
        lines: list[str] = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: c.key[0]):
                lines.append("  " * depth + repr(child))
                walk(child, depth + 1)

        walk(self._root, 0)
        lines.append(f"#tokens: {self.total_size()} (evictable {self._evictable_size})")
        return "\n".join(lines)

    # ---- internals -----------------------------------------------------------------------
    def _walk(
        self, key_bytes: bytes, extra_key: str | None
    ) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """The walk ``match_prefix`` and ``insert`` share: follow the key's whole pages down from
        the root, touching access times and splitting the node a partial hit ends in. Returns the
        last node reached, the number of tokens matched and the values on the way."""
        now = next(self._clock)
        root = node = self._root
        root.last_access_time = now
        values: list[torch.Tensor] = []
        leaves = self._leaves
        page = self._page_bytes
        end = len(key_bytes) - len(key_bytes) % page
        off = 0  # in bytes
        while off < end:
            first = key_bytes[off : off + page]
            child = node.children.get((extra_key, first) if node is root else first)
            if child is None:
                break
            child.last_access_time = now
            if child in leaves:  # a leaf touched: its place in the LRU order moves
                self._push_lru(child)
            if key_bytes.startswith(child.key_bytes, off, end):  # the whole edge matches
                off += len(child.key_bytes)
            else:
                n = self._common_len(child.key, key_bytes, off, end)
                child = self._split(child, n)
                off += n * _TOKEN_BYTES
            values.append(child.value)  # type: ignore[arg-type]  # (None: a tier-only tail)
            node = child
        return node, off // _TOKEN_BYTES, values

    def _push_lru(self, node: TreeNode) -> None:
        """Give an unlocked leaf its entry at its current access time (older ones go stale)."""
        if node.lock_ref:
            return  # it gets one when unlocked (dec_lock_ref)
        if len(self._lru) > 2 * len(self._leaves) + 64:  # mostly stale: start afresh
            self._rebuild_lru()  # (it includes ``node`` when it is a leaf already)
        heapq.heappush(self._lru, (node.last_access_time, node.id, node))

    def _rebuild_lru(self) -> None:
        self._lru = [(n.last_access_time, n.id, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(self._lru)

    def _nodes(self) -> list[TreeNode]:
        out, stack = [], [self._root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _child_key(
        self, parent: TreeNode, extra_key: str | None, key_bytes: bytes
    ) -> bytes | tuple[str | None, bytes]:
        first = key_bytes[: self._page_bytes]
        return (extra_key, first) if parent is self._root else first

    def _common_len(self, key: np.ndarray, other: bytes, start: int, end: int) -> int:
        """Whole pages ``key`` shares with the int32 tokens of ``other[start:end]`` (bytes)."""
        b = np.frombuffer(other, dtype=np.int32, count=(end - start) // _TOKEN_BYTES, offset=start)
        n = min(len(key), len(b))
        differs = key[:n] != b[:n]
        first = int(differs.argmax())  # the first True, or 0 when there is none
        common = first if differs[first] else n
        return common - common % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; the new upper node takes its place under the parent."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child)
        upper = TreeNode(
            next(self._node_ids),
            child.key_bytes[: n * _TOKEN_BYTES],
            None if child.value is None else child.value[:n],
            parent,
            child.extra_key,
            child.last_access_time,
        )
        upper.lock_ref = child.lock_ref
        child.key_bytes = child.key_bytes[n * _TOKEN_BYTES :]
        if child.value is not None:
            child.value = child.value[n:]
        if child.tier_value is not None:
            upper.tier_value, child.tier_value = child.tier_value[:n], child.tier_value[n:]
        child.parent = upper
        upper.children[self._child_key(upper, child.extra_key, child.key_bytes)] = child
        parent.children[self._child_key(parent, upper.extra_key, upper.key_bytes)] = upper
        if self.events is not None:
            self.events.split(upper, child)
        return upper

    def _delete_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        assert parent is not None
        del parent.children[self._child_key(parent, leaf.extra_key, leaf.key_bytes)]
        self._leaves.discard(leaf)
        if parent is not self._root and parent.is_leaf:
            self._leaves.add(parent)
        return parent
