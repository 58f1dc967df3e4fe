"""TreeDraftIndex: what the radix tree caches, indexed for drafts, by namespace.

An observer of the tree (``radix.tree_observer``): it hears the same calls as the KV event
recorder. When a node enters the pool (``stored``, medium ``POOL``) its tokens are copied into a
*segment*, preceded by up to ``max_n`` tokens of its path (its context), and every place in the
segment after which a continuation exists is indexed by a hash of the ``min_n`` tokens ending
there. When the node leaves the pool (evicted, or moved to a KV tier) its segment goes, and
``all_cleared`` drops everything: the index never holds text the pool does not. A node split
after it was stored keeps its id on the lower part, so evicting that part drops the segment of
the whole run it was stored with (the upper part, still cached, is no longer indexed: a draft
lost, never a wrong one).

Bounded: at most ``capacity`` tokens of segments (the oldest segments go first) and
``max_entries`` places per hash (the newest kept). A lookup only reads the table of the
request's namespace (its tenant, adapter and ``cache_salt``), so a draft never crosses one.

Lookup: hash the request's last ``min_n`` tokens, grow each candidate's match backwards (up to
``max_n``), take the longest match, then the longest continuation, then the newest place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixserve.radix.tree_node import TreeNode
from radixserve.radix.tree_observer import POOL
from radixserve.spec.suffix_match import NO_DRAFT, Draft

_PRIME = np.uint64(0x100000001B3)
_PRIME_INT = int(_PRIME)
_MASK64 = (1 << 64) - 1
_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1


@dataclass(slots=True)
class _Segment:
    tokens: np.ndarray  # [context + key] int32
    start: int  # where the node's own tokens begin (the context's length)
    namespace: str | None


class TreeDraftIndex:
    """See the module doc. ``page_size``: the tree's (an observer states it)."""

    def __init__(
        self,
        page_size: int,
        min_n: int,
        max_n: int,
        capacity: int,
        max_entries: int = 8,
    ) -> None:
        if not 1 <= min_n <= max_n or capacity < 1 or max_entries < 1:
            raise ValueError("need 1 <= min_n <= max_n, capacity >= 1 and max_entries >= 1")
        self.page_size = page_size
        self.min_n, self.max_n = min_n, max_n
        self.capacity = capacity
        self.max_entries = max_entries
        self._segments: dict[int, _Segment] = {}  # node id -> segment, oldest first
        self._tables: dict[str | None, dict[int, list[int]]] = {}
        self.num_tokens = 0  # node tokens held (contexts not counted)

    # ---- the observer ------------------------------------------------------------------------
    def stored(self, node: TreeNode, medium: str) -> None:
        if medium != POOL:
            return
        if node.id in self._segments:
            self._drop(node.id)
        key = node.key
        if key.shape[0] == 0 or key.shape[0] > self.capacity:
            return
        while self.num_tokens + key.shape[0] > self.capacity:
            self._drop(next(iter(self._segments)))
        context = _path_tail(node, self.max_n)
        seg = _Segment(np.concatenate([context, key]), context.shape[0], node.extra_key)
        self._segments[node.id] = seg
        self.num_tokens += int(key.shape[0])
        table = self._tables.setdefault(seg.namespace, {})
        ends, hashes = self._places(seg)
        for e, h in zip(ends.tolist(), hashes.tolist(), strict=True):
            entries = table.get(h)
            if entries is None:
                table[h] = [(node.id << _POS_BITS) | e]
                continue
            entries.append((node.id << _POS_BITS) | e)
            if len(entries) > self.max_entries:
                del entries[0]

    def removed(self, node: TreeNode, medium: str) -> None:
        if medium == POOL and node.id in self._segments:
            self._drop(node.id)

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        """Nothing: ``lower`` keeps its whole segment (the text it held when stored), which
        goes when it leaves the pool; ``upper``'s tokens then stay only as drafts seen again."""

    def all_cleared(self) -> None:
        self._segments.clear()
        self._tables.clear()
        self.num_tokens = 0

    # ---- drafts ------------------------------------------------------------------------------
    def propose(self, tokens: np.ndarray, namespace: str | None, k: int) -> Draft:
        """Up to ``k`` tokens that followed the longest match of ``tokens``' suffix in the
        cached sequences of ``namespace`` (:data:`NO_DRAFT` when none matches ``min_n``)."""
        table = self._tables.get(namespace)
        n = self.min_n
        if not table or k < 1 or tokens.shape[0] < n:
            return NO_DRAFT
        tail = tokens[-self.max_n :].tolist()[::-1]  # the request's last tokens, newest first
        entries = table.get(_hash_tail(tail[:n]))
        if not entries:
            return NO_DRAFT
        best: tuple[int, int] = (0, 0)
        best_at: tuple[np.ndarray, int] | None = None
        for entry in reversed(entries):  # newest first: it wins ties
            seg = self._segments[entry >> _POS_BITS]
            e = entry & _POS_MASK
            m = _match_len(seg.tokens, e, tail)
            if m < n:
                continue
            found = (m, min(k, int(seg.tokens.shape[0]) - e - 1))  # match, continuation
            if found > best:
                best, best_at = found, (seg.tokens, e)
        if best_at is None:
            return NO_DRAFT
        seg_tokens, e = best_at
        return Draft(seg_tokens[e + 1 : e + 1 + k].copy(), best[0], "tree")

    def check_integrity(self) -> None:
        """Every entry names a live segment of its namespace at an indexed place; the token
        count adds up and stays within ``capacity``."""
        assert self.num_tokens == sum(
            s.tokens.shape[0] - s.start for s in self._segments.values()
        ), "the token count is off"
        assert self.num_tokens <= self.capacity, "over capacity"
        for namespace, table in self._tables.items():
            for entries in table.values():
                assert entries and len(entries) <= self.max_entries
                for entry in entries:
                    seg = self._segments[entry >> _POS_BITS]
                    assert seg.namespace == namespace, "an entry crossed namespaces"
                    assert entry & _POS_MASK < seg.tokens.shape[0] - 1

    # ---- internals ---------------------------------------------------------------------------
    def _places(self, seg: _Segment) -> tuple[np.ndarray, np.ndarray]:
        """Indexed ends ``e`` (a continuation starts at ``e + 1`` inside the node's tokens, and
        ``min_n`` tokens end at ``e``) and their hashes."""
        n = self.min_n
        first = max(seg.start - 1, n - 1)
        last = seg.tokens.shape[0] - 2
        if last < first:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        windows = _hash_windows(seg.tokens[first - n + 1 : last + 1], n)
        return np.arange(first, last + 1, dtype=np.int64), windows

    def _drop(self, node_id: int) -> None:
        seg = self._segments.pop(node_id)
        self.num_tokens -= int(seg.tokens.shape[0] - seg.start)
        table = self._tables.get(seg.namespace)
        if table is None:
            return
        _, hashes = self._places(seg)
        for h in set(hashes.tolist()):
            entries = table.get(h)
            if entries is None:
                continue
            kept = [x for x in entries if x >> _POS_BITS != node_id]
            if kept:
                table[h] = kept
            else:
                del table[h]
        if not table:
            del self._tables[seg.namespace]


def _path_tail(node: TreeNode, n: int) -> np.ndarray:
    """The last ``n`` (or fewer, near the root) tokens of the path before ``node``."""
    parts: list[bytes] = []
    need = n
    parent = node.parent
    while need > 0 and parent is not None and parent.parent is not None:  # not the root
        piece = parent.key_bytes[-4 * need :]
        parts.append(piece)
        need -= len(piece) // 4
        parent = parent.parent
    return np.frombuffer(b"".join(reversed(parts)), dtype=np.int32)


def _hash_windows(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of each window of ``n`` consecutive tokens (``len - n + 1`` of them)."""
    t = tokens.astype(np.uint64)
    count = t.shape[0] - n + 1
    h = np.zeros(count, dtype=np.uint64)
    for i in range(n):
        h = h * _PRIME + t[i : i + count] + np.uint64(1)
    return h


def _hash_tail(newest_first: list[int]) -> int:
    """:func:`_hash_windows` of one window, given newest token first, in Python ints (the same
    uint64 arithmetic, wrapping): one lookup's hash without numpy's per-call cost."""
    h = 0
    for t in reversed(newest_first):
        h = (h * _PRIME_INT + (t & _MASK64) + 1) & _MASK64
    return h


def _match_len(seg_tokens: np.ndarray, end: int, tail: list[int]) -> int:
    """How many tokens ending at ``seg_tokens[end]`` equal the request's last ones (``tail``,
    newest first: at most ``max_n``). A few Python compares: cheaper than numpy's calls."""
    n = min(len(tail), end + 1)
    window = seg_tokens[end + 1 - n : end + 1].tolist()[::-1]
    m = 0
    while m < n and window[m] == tail[m]:
        m += 1
    return m
