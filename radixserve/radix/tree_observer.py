"""Who hears of the radix tree's changes: the KV event recorder, and anything else that follows
what the pool holds (the speculative drafter's index, ``radixserve.spec``).

The tree calls its one ``events`` object where a node enters a medium (``stored``), leaves one
(``removed``), is cut in two (``split``) or everything goes (``all_cleared``);
:class:`TreeObservers` lets several objects hear the same calls, in order, so none of the
tree's call sites changes for a second listener. This interface is all the tree knows of its
listeners: what an observer keeps, or sends where, is its own (the KV event recorder's wire
format and page hashes live in ``radix/kv_events.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from radixserve.radix.tree_node import TreeNode

# the media a node's KV may be in: the pool the model reads, a KV tier in host memory, a KV
# tier in a file
POOL = "pool"
HOST_TIER = "host"
FILE_TIER = "file"


class TreeObserver(Protocol):
    """``page_size``: the tree's; ``medium``: :data:`POOL`, :data:`HOST_TIER` or
    :data:`FILE_TIER`. Observers never change the tree's structure and never raise."""

    page_size: int

    def stored(self, node: TreeNode, medium: str) -> None: ...

    def removed(self, node: TreeNode, medium: str) -> None: ...

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        """``lower`` was cut after its first tokens, which ``upper`` (new, its parent now)
        holds; both are in the media ``lower`` was."""

    def all_cleared(self) -> None: ...


class TreeObservers:
    """Several observers as one; :meth:`take` returns the KV events of those that record them
    (what the publisher sends once per step)."""

    def __init__(self, observers: Sequence[TreeObserver]) -> None:
        if not observers or len({o.page_size for o in observers}) != 1:
            raise ValueError("observers of one tree share its page size")
        self.observers = list(observers)
        self.page_size = observers[0].page_size

    def stored(self, node: TreeNode, medium: str) -> None:
        for o in self.observers:
            o.stored(node, medium)

    def removed(self, node: TreeNode, medium: str) -> None:
        for o in self.observers:
            o.removed(node, medium)

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        for o in self.observers:
            o.split(upper, lower)

    def all_cleared(self) -> None:
        for o in self.observers:
            o.all_cleared()

    def take(self) -> list[Any]:
        return [e for o in self.observers if hasattr(o, "take") for e in o.take()]


def with_observer(current: TreeObserver | None, observer: TreeObserver) -> TreeObserver:
    """``current`` (a tree's ``events``) and ``observer`` as one."""
    if current is None:
        return observer
    if isinstance(current, TreeObservers):
        return TreeObservers([*current.observers, observer])
    return TreeObservers([current, observer])
