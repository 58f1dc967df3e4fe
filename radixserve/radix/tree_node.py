"""TreeNode: one edge of the radix tree, holding a run of tokens and their KV slots."""

from __future__ import annotations

import itertools

import numpy as np
import torch

_node_ids = itertools.count()


class TreeNode:
    """A node owns the token run ``key`` on the edge from its parent and the matching ``value``.

    ``children`` maps a child's first token (first page when ``page_size > 1``, namespaced by the
    extra key) to the child. ``lock_ref`` counts the locks held on this node or a descendant.
    """

    __slots__ = (
        "id",
        "key",
        "value",
        "parent",
        "children",
        "extra_key",
        "lock_ref",
        "last_access_time",
    )

    def __init__(
        self,
        key: np.ndarray,  # [n] int32 tokens
        value: torch.Tensor,  # [n] int64 KV slots
        parent: TreeNode | None,
        extra_key: str | None = None,
        last_access_time: int = 0,
    ) -> None:
        self.id = next(_node_ids)
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[tuple[str | None, bytes], TreeNode] = {}
        self.extra_key = extra_key
        self.lock_ref = 0
        self.last_access_time = last_access_time

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        head = self.key[:6].tolist()
        more = "..." if len(self.key) > 6 else ""
        return f"TreeNode(len={len(self.key)}, key={head}{more}, lock_ref={self.lock_ref})"
