"""TreeNode: one edge of the radix tree, holding a run of tokens and their KV slots."""

from __future__ import annotations

import numpy as np
import torch


class TreeNode:
    """A node owns the token run on the edge from its parent and the matching ``value``.

    The run is kept as the bytes of its int32 tokens (``key_bytes``: the tree compares a whole
    edge with one ``bytes.startswith``); ``key`` is a read-only int32 view of them, made on use.
    ``value`` is ``None`` when the KV lives only in the second tier (``TieredRadixCache``), which
    then holds it in ``tier_value`` (tier slots); a node with a ``value`` and a ``tier_value`` has
    a copy in each. ``children`` maps a child's first page of tokens (as bytes; under the root, paired with the
    extra key, which namespaces whole paths) to the child. ``lock_ref`` counts the locks held on
    this node or a descendant. ``id`` (given by the tree) breaks LRU ties by creation order.
    ``event_digests``: its pages' chain hashes, once a KV event published them.
    """

    __slots__ = (
        "id",
        "key_bytes",
        "value",
        "tier_value",
        "parent",
        "children",
        "extra_key",
        "lock_ref",
        "last_access_time",
        "event_digests",
    )

    def __init__(
        self,
        node_id: int,
        key_bytes: bytes,  # [n] int32 tokens, native byte order
        value: torch.Tensor | None,  # [n] int64 KV slots; None: in the tier only
        parent: TreeNode | None,
        extra_key: str | None = None,
        last_access_time: int = 0,
    ) -> None:
        self.id = node_id
        self.key_bytes = key_bytes
        self.value = value
        self.tier_value: torch.Tensor | None = None  # [n] int64 tier slots (TieredRadixCache)
        self.parent = parent
        self.children: dict[object, TreeNode] = {}
        self.extra_key = extra_key
        self.lock_ref = 0
        self.last_access_time = last_access_time
        self.event_digests: bytes | None = None  # its pages' hashes, once published

    @property
    def key(self) -> np.ndarray:  # [n] int32, read-only
        return np.frombuffer(self.key_bytes, dtype=np.int32)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def on_device(self) -> bool:
        """Its KV is in the pool (else only in the tier)."""
        return self.value is not None

    def __len__(self) -> int:
        return len(self.key_bytes) >> 2  # int32 tokens

    def __repr__(self) -> str:
        head = self.key[:6].tolist()
        more = "..." if len(self.key) > 6 else ""
        where = ("D" if self.value is not None else "") + (
            "T" if self.tier_value is not None else ""
        )
        return f"TreeNode(len={len(self.key)}, key={head}{more}, lock_ref={self.lock_ref}, {where})"
