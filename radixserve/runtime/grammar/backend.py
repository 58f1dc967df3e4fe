"""The grammar plug point: a :class:`GrammarBackend` compiles a grammar once (cached by its
key) and makes a :class:`GrammarMatcher` per request.

This module is the protocol alone: it imports no implementation. The one implementation is on
llguidance (``llguidance_backend.py``; why in ``docs/structured_output.md``), chosen and
imported lazily by ``factory.py``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import torch

# (kind, source): kind is "regex", "json_schema", "ebnf" or "json_object" (source ignored)
GrammarKey = tuple[str, str]
KINDS = ("regex", "json_schema", "ebnf", "json_object")


class GrammarMatcher(Protocol):
    """One request's position in its grammar. Not thread-safe: one owner at a time."""

    def accept_token(self, token: int) -> bool:
        """Advance by ``token``; ``False`` if the grammar does not allow it (state unchanged)."""
        ...

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (``[bs, ceil(vocab / 32)]``
        int32 on the CPU; bit ``t % 32`` of word ``t // 32`` set: token ``t`` allowed)."""
        ...

    def is_terminated(self) -> bool:
        """The grammar is complete and admits no further token (EOS accepted or nothing left)."""
        ...

    def forced_tokens(self) -> list[int]:
        """The continuation the grammar forces from here, tokenized canonically (may be empty)."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        ...

    def reset(self) -> None:
        """Back to the start of the grammar (no token accepted)."""
        ...


class GrammarBackend(Protocol):
    """Compiles grammars for one tokenizer and vocabulary; ``compile`` is cached by key, in
    each cache scope apart (see :class:`CompileCache`)."""

    def compile(self, key: GrammarKey, scope: str | None = None) -> Any:
        """The compiled grammar of ``key``; ``ValueError`` naming the problem if invalid."""
        ...

    def matcher(self, compiled: Any) -> GrammarMatcher: ...


class CompileCache:
    """Small thread-safe LRUs of compiled grammars (or of validation results) by key, one per
    cache scope (a tenant: ``runtime/io_struct.py``'s ``cache_scope``), each bounded alone.
    A grammar compiled for one tenant is compiled again for another, and no tenant's grammars
    evict another's: how long its request took to start tells a tenant nothing of what the
    others asked for."""

    def __init__(self, build: Callable[[GrammarKey], Any], max_entries: int = 256) -> None:
        self._build = build
        self._max = max_entries
        self._scopes: dict[str | None, OrderedDict[GrammarKey, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: GrammarKey, scope: str | None = None) -> Any:
        with self._lock:
            entries = self._scopes.get(scope)
            if entries is not None and key in entries:
                entries.move_to_end(key)
                return entries[key]
        value = self._build(key)  # raises for an invalid grammar: nothing cached
        with self._lock:
            entries = self._scopes.setdefault(scope, OrderedDict())
            entries[key] = value
            while len(entries) > self._max:
                entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._scopes.values())
