"""A KV event consumer, as a gateway's index is, and the tree's own contents to compare it with.

:class:`EventIndex` knows only what the events say (each page's hash, its parent's hash and its
tokens; which media hold it) and checks what a consumer relies on: a page is never stored twice
in one medium nor removed from a medium that does not hold it, and a stored page's parent is a
page it has seen. :meth:`EventIndex.contents` and :func:`tree_contents` describe a cache the same
way: a multiset of (every token from the root to the end of a page, medium), one per page held.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from radixserve.radix.kv_events import (
    L1,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
)

Contents = Counter[tuple[tuple[int, ...], str]]

_decode = msgspec.msgpack.Decoder(KVEventBatch).decode
_encode = msgspec.msgpack.Encoder().encode


class EventIndex:
    def __init__(self) -> None:
        self.pages: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.held: dict[str, set[int]] = {}
        self.num_batches = 0

    def apply_payload(self, payload: bytes) -> None:
        self.apply(_decode(payload).events)
        self.num_batches += 1

    def apply_events(self, events: list[KVCacheEvent]) -> None:
        """Through the wire: events encoded in a batch and decoded again."""
        if events:
            self.apply_payload(_encode(KVEventBatch(0.0, events)))  # type: ignore[arg-type]

    def apply(self, events: Iterable[KVCacheEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                held = self.held.setdefault(event.medium or L1, set())
                size = event.block_size
                assert len(event.token_ids) == size * len(event.block_hashes)
                parent = event.parent_block_hash
                assert parent is None or parent in self.pages, "a parent never stored"
                for i, block in enumerate(event.block_hashes):
                    tokens = tuple(event.token_ids[i * size : (i + 1) * size])
                    assert self.pages.get(block, (parent, tokens)) == (parent, tokens), (
                        "one hash for two pages"
                    )
                    self.pages[block] = (parent, tokens)
                    assert block not in held, f"stored twice in {event.medium}"
                    held.add(block)
                    parent = block
            elif isinstance(event, BlockRemoved):
                held = self.held.setdefault(event.medium or L1, set())
                for block in event.block_hashes:
                    assert block in held, f"removed from {event.medium}, which does not hold it"
                    held.remove(block)
            else:
                assert isinstance(event, AllBlocksCleared)
                self.held = {}

    def contents(self) -> Contents:
        out: Contents = Counter()
        for medium, blocks in self.held.items():
            for block in blocks:
                out[(self._prefix(block), medium)] += 1
        return out

    def _prefix(self, block: int | None) -> tuple[int, ...]:
        parts = []
        while block is not None:
            block, tokens = self.pages[block]
            parts.append(tokens)
        return tuple(t for tokens in reversed(parts) for t in tokens)


def contents_of_nodes(
    nodes: Iterable[tuple[int, int | None, list[int], str]], page_size: int, tier_medium: str
) -> Contents:
    """The pages of a tree given as ``(id, parent id, token ids, where)``, parents first;
    ``where``: D (the pool), T (the tier) or DT."""
    out: Contents = Counter()
    path: dict[int | None, tuple[int, ...]] = {None: ()}
    for node_id, parent, tokens, where in nodes:
        above = path[parent]
        path[node_id] = above + tuple(tokens)
        for end in range(page_size, len(tokens) + 1, page_size):
            prefix = above + tuple(tokens[:end])
            if "D" in where:
                out[(prefix, L1)] += 1
            if "T" in where:
                out[(prefix, tier_medium)] += 1
    return out


def tree_contents(tree: object, tier_medium: str = "") -> Contents:
    """What a :class:`RadixCache` (or ``TieredRadixCache``) holds, read from its nodes."""
    root = tree.root  # type: ignore[attr-defined]
    order, stack = [], list(root.children.values())
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    rows = [
        (
            id(n),
            None if n.parent is root else id(n.parent),
            n.key.tolist(),
            ("D" if n.value is not None else "") + ("T" if n.tier_value is not None else ""),
        )
        for n in order
    ]
    return contents_of_nodes(rows, tree.page_size, tier_medium)  # type: ignore[attr-defined]
