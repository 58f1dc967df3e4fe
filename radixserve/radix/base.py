"""The PrefixCache protocol: what the scheduler may ask of a prefix cache.

Ownership rules (the contract every implementation keeps):
- Keys are token-id sequences, values KV-slot index tensors (int64) of the same length.
- Keys travel as int32 ndarrays (``Req.fill_ids``): the tree reads their bytes (one memcpy per
  call) and converts nothing. A list or tensor key also works (converted once per call).
- ``match_prefix`` is read-only apart from access times and node splits.
- ``insert`` takes ownership of the value entries it stores. Its :class:`InsertResult` says how
  many leading entries it did *not* take because it already held that prefix (the caller frees
  those it allocated beyond what it already shared), and hands back what a ``match_prefix`` of
  the same key would return now, so nobody walks the tree twice.
- ``evict`` returns the indices it dropped; the caller frees them. A cache never frees memory.
- A locked node (``inc_lock_ref``) and its ancestors are never evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

TokenKey = Sequence[int] | np.ndarray | torch.Tensor


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The longest cached prefix: ``indices`` in the pool, then ``tier_len`` more tokens whose
    KV is in the second tier only (``TieredRadixCache``; a load-back brings them into the pool
    before the forward that needs them). ``last_node`` is where the whole match ends; a lock on
    it keeps both parts alive (the pool part from eviction, the tier part from the tier's)."""

    indices: torch.Tensor  # [device_len] int64 pool slots of the prefix's first part
    last_node: Any  # the node the match ends at; lock it to keep the prefix alive
    tier_len: int = 0  # tokens after ``indices`` held in the tier only

    @property
    def cached_len(self) -> int:
        """Tokens the request need not compute: in the pool or loaded back from the tier."""
        return self.indices.shape[0] + self.tier_len


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What ``insert(key, value)`` leaves behind.

    Interval table over the page-aligned key ``key[:aligned]``::

        [0, num_present)        the tree already held these: the caller frees its own copies
                                (beyond the prefix it already shared with the tree)
        [num_present, aligned)  taken from ``value``: the tree owns these slots now
        [aligned, len(key))     a partial page: never taken, the caller keeps (and frees) it
    """

    num_present: int  # tokens of the key the tree held before this insert
    indices: torch.Tensor  # [aligned] int64: the tree's slots for the key, as match_prefix(key)
    #   (empty for the null cache, which holds nothing)
    last_node: Any  # the node the key ends at (what match_prefix(key).last_node is now)


class PrefixCache(Protocol):
    page_size: int

    @property
    def is_disabled(self) -> bool:
        """True for the null cache: nothing is ever shared, cache-aware policies act as FCFS."""
        ...

    @property
    def root(self) -> Any: ...

    def add_observer(self, observer: Any) -> None:
        """Let ``observer`` (a ``radix.tree_observer.TreeObserver``) hear of every node that
        enters or leaves a medium from now on."""
        ...

    def match_prefix(self, key: TokenKey, extra_key: str | None = None) -> MatchResult:
        """Longest cached prefix of ``key`` (whole pages only), splitting a node on a partial hit."""
        ...

    def insert(
        self, key: TokenKey, value: torch.Tensor, extra_key: str | None = None
    ) -> InsertResult:
        """Store ``key -> value`` (truncated to whole pages) in the same walk as a match: the
        result's ``indices`` and ``last_node`` equal a ``match_prefix(key)`` made right after."""
        ...

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop least-recently-used unlocked leaves until ``num_tokens`` are freed or none is left."""
        ...

    def inc_lock_ref(self, node: Any) -> int:
        """Protect ``node`` and its ancestors; returns the change of ``evictable_size()``."""
        ...

    def dec_lock_ref(self, node: Any) -> int:
        """Undo one ``inc_lock_ref``; returns the change of ``evictable_size()``."""
        ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...

    def all_values(self) -> torch.Tensor:
        """Every value the cache holds (for integrity checks and flushing)."""
        ...

    def reset(self) -> None:
        """Forget everything. The caller frees ``all_values()`` first."""
        ...

    def check_integrity(self) -> None: ...

    def pretty_print(self) -> str: ...
