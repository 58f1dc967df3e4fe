"""A bounded picture of a radix tree, for the live cache page (``/cache_tree``).

A big tree is not sent whole: :func:`summarize_tree` keeps the ``max_nodes`` nodes that hold
the most tokens below them (best first from the root, so every kept node's parent is kept),
and says of each kept node how many children and tokens it leaves out. One pass over the tree
computes the subtree sizes; the walk is iterative (a long conversation is a deep path).
"""

from __future__ import annotations

import heapq
from typing import Any

from radixserve.radix.base import PrefixCache
from radixserve.radix.radix_cache import RadixCache
from radixserve.radix.tree_node import TreeNode

HEAD_TOKENS = 32  # the tokens of a node's run sent for its hover text


def summarize_tree(
    cache: PrefixCache, max_nodes: int, head_tokens: int | None = HEAD_TOKENS
) -> dict:
    """The tree as JSON-ready data: ``nodes`` (parents before children; ``head_ids``, the
    first ``head_tokens`` of each run, None: all; ``where``: D, DT or T), ``total_nodes``,
    ``total_tokens``, ``shown_nodes``, ``clock`` (the newest access stamp: a node's
    ``last_access`` close to it was hit recently) and ``disabled`` (no radix cache)."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    if not isinstance(cache, RadixCache):
        return _empty(disabled=True)
    sizes = _subtree_tokens(cache.root)
    total_nodes = len(sizes) - 1  # the root holds no tokens and is always shown
    kept: list[TreeNode] = [cache.root]
    kept_ids = {cache.root.id}
    frontier: list[tuple[int, int, TreeNode]] = []
    for child in cache.root.children.values():
        heapq.heappush(frontier, (-sizes[child.id], child.id, child))
    while frontier and len(kept) < max_nodes + 1:
        _, _, node = heapq.heappop(frontier)
        kept.append(node)
        kept_ids.add(node.id)
        for child in node.children.values():
            heapq.heappush(frontier, (-sizes[child.id], child.id, child))
    clock = max((n.last_access_time for n in kept), default=0)
    nodes = [_node_dict(n, sizes, kept_ids, head_tokens) for n in kept]
    return {
        "disabled": False,
        "total_nodes": total_nodes,
        "total_tokens": sizes[cache.root.id],
        "shown_nodes": len(kept) - 1,
        "clock": clock,
        "nodes": nodes,
    }


def _empty(disabled: bool) -> dict[str, Any]:
    return {
        "disabled": disabled,
        "total_nodes": 0,
        "total_tokens": 0,
        "shown_nodes": 0,
        "clock": 0,
        "nodes": [],
    }


def _subtree_tokens(root: TreeNode) -> dict[int, int]:
    """Node id -> tokens in the node and all below it (post-order, no recursion)."""
    order: list[TreeNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    sizes: dict[int, int] = {}
    for node in reversed(order):  # children before parents
        sizes[node.id] = len(node) + sum(sizes[c.id] for c in node.children.values())
    return sizes


def _node_dict(
    node: TreeNode, sizes: dict[int, int], kept_ids: set[int], head_tokens: int | None
) -> dict[str, Any]:
    hidden = [c for c in node.children.values() if c.id not in kept_ids]
    return {
        "id": node.id,
        "parent": None if node.parent is None else node.parent.id,
        "num_tokens": len(node),
        "subtree_tokens": sizes[node.id],
        "head_ids": node.key[:head_tokens].tolist(),
        "lock_ref": node.lock_ref,
        "locked": node.lock_ref > 0,
        "evictable": node.parent is not None and node.lock_ref == 0,
        "last_access": node.last_access_time,
        "extra_key": node.extra_key,
        "where": ("D" if node.value is not None else "")
        + ("T" if node.tier_value is not None else ""),
        "hidden_children": len(hidden),
        "hidden_tokens": sum(sizes[c.id] for c in hidden),
    }
