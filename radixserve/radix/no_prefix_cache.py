"""NoPrefixCache: the null object behind ``--disable-radix-cache``."""

from __future__ import annotations

import torch

from radixserve.radix.base import InsertResult, MatchResult, TokenKey

_EMPTY = torch.empty(0, dtype=torch.int64)


class NoPrefixCache:
    """Caches nothing. ``insert`` takes nothing: like ``RadixCache`` it looks at whole pages only
    and reports them all as already present (``num_present``), so the caller frees every page it
    allocated (and its partial last page, which no cache takes); its ``indices`` are empty, as a
    match would be. Matches are always empty and end at the root; locks are no-ops."""

    events = None  # no KV events: nothing is ever cached

    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size
        self._root = object()

    @property
    def is_disabled(self) -> bool:
        return True

    def add_observer(self, observer: object) -> None:
        pass  # nothing is ever stored: nothing to hear

    @property
    def root(self) -> object:
        return self._root

    def match_prefix(self, key: TokenKey, extra_key: str | None = None) -> MatchResult:
        return MatchResult(_EMPTY, self._root)

    def insert(
        self, key: TokenKey, value: torch.Tensor, extra_key: str | None = None
    ) -> InsertResult:
        return InsertResult(len(value) - len(value) % self.page_size, _EMPTY, self._root)

    def evict(self, num_tokens: int) -> torch.Tensor:
        return _EMPTY

    def inc_lock_ref(self, node: object) -> int:
        return 0

    def dec_lock_ref(self, node: object) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def all_values(self) -> torch.Tensor:
        return _EMPTY

    def reset(self) -> None:
        pass

    def check_integrity(self) -> None:
        pass

    def pretty_print(self) -> str:
        return "<no prefix cache>"
