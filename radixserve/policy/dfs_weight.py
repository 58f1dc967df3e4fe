"""DFS-weight ordering (SGLang's ``_sort_by_dfs_weight``): one radix branch's requests together.

The weight of a tree node is the number of waiting requests whose match ends at the node or
below it. A depth-first walk from the root visits heavier children first and emits a node's own
requests after its whole subtree, so requests sharing the longest cached branch run back to back
and the branch stays hot. Requests with no cache hit (``last_node`` is the root) come last.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from radixserve.radix.base import MatchResult
from radixserve.types import Req


def dfs_weight_rank(
    reqs: Sequence[Req], matches: Mapping[Req, MatchResult], root: Any
) -> dict[str, int]:
    """Position of each request (by ``rid``) in the DFS-weight order.

    Needs each request's match made this pass (its ``last_node`` must still hang under ``root``);
    reads ``node.parent`` and ``node.children`` only. Only the branches that hold a request are
    walked, so the cost grows with the requests' depth, not with the size of the tree. Equal
    weights keep the children's insertion order (SGLang's stable ``sorted``).
    """
    node_reqs: dict[Any, list[Req]] = defaultdict(list)
    for req in reqs:
        node_reqs[matches[req].last_node].append(req)

    weight: dict[Any, int] = defaultdict(int)
    for node, group in node_reqs.items():
        while node is not None:
            weight[node] += len(group)
            if node is root:
                break
            node = node.parent

    order: list[Req] = []
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, subtree_done = stack.pop()
        if subtree_done:
            order.extend(node_reqs.get(node, ()))
            continue
        stack.append((node, True))
        children = [c for c in node.children.values() if c in weight]
        children.sort(key=lambda c: -weight[c])
        stack.extend((c, False) for c in reversed(children))

    rank = {req.rid: i for i, req in enumerate(order)}
    # Defensive: a request whose node no longer hangs under the root keeps its queue order.
    for req in reqs:
        rank.setdefault(req.rid, len(rank))
    return rank
