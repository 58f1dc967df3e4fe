"""The grammar plug point: a :class:`GrammarBackend` compiles a grammar once (cached by its
key) and makes a :class:`GrammarMatcher` per request.

One implementation, on llguidance (``llguidance_backend.py``; why in
``docs/structured_output.md``). The library is an optional extra, imported lazily: without it
a constrained request is a ``ValueError`` (HTTP 400) that says how to install it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch

# (kind, source): kind is "regex", "json_schema", "ebnf" or "json_object" (source ignored)
GrammarKey = tuple[str, str]
KINDS = ("regex", "json_schema", "ebnf", "json_object")
MISSING = "structured output needs `pip install radixserve[structured]` (llguidance)"


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
    """Compiles grammars for one tokenizer and vocabulary; ``compile`` is cached by key."""

    def compile(self, key: GrammarKey) -> Any:
        """The compiled grammar of ``key``; ``ValueError`` naming the problem if invalid."""
        ...

    def matcher(self, compiled: Any) -> GrammarMatcher: ...


class CompileCache:
    """A small thread-safe LRU of compiled grammars (or of validation results) by key."""

    def __init__(self, build: Callable[[GrammarKey], Any], max_entries: int = 256) -> None:
        self._build = build
        self._max = max_entries
        self._entries: OrderedDict[GrammarKey, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: GrammarKey) -> Any:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = self._build(key)  # raises for an invalid grammar: nothing cached
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)


def create_grammar_backend(
    tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]
) -> GrammarBackend:
    """The llguidance backend for ``tokenizer`` (a Hugging Face fast tokenizer) and the model's
    ``vocab_size`` (which may exceed the tokenizer's); ``ValueError`` if it cannot be built."""
    if tokenizer is None:
        raise ValueError("structured output needs a tokenizer: this engine has none")
    try:
        from radixserve.runtime.grammar.llguidance_backend import LLGuidanceBackend
    except ImportError:
        raise ValueError(MISSING) from None
    return LLGuidanceBackend(tokenizer, vocab_size, eos_token_ids)


def check_grammar(key: GrammarKey) -> None:
    """Validate ``key`` without a tokenizer (the edge's check, before the request is queued):
    ``ValueError`` that says what is wrong."""
    try:
        from radixserve.runtime.grammar.llguidance_backend import grammar_source
    except ImportError:
        raise ValueError(MISSING) from None
    grammar_source(key)


class GrammarFactory:
    """The scheduler's grammars: a request's :class:`ReqGrammar` from its key, the backend
    built by the first request that has one (a server without any never imports it)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self._args = (tokenizer, vocab_size, frozenset(eos_token_ids))
        self.backend: GrammarBackend | None = None

    def for_key(self, key: GrammarKey | None) -> Any:
        """``None`` without a key; ``ValueError`` for a grammar this tokenizer cannot run."""
        if key is None:
            return None
        from radixserve.runtime.grammar.req_grammar import ReqGrammar

        if self.backend is None:
            self.backend = create_grammar_backend(*self._args)
        return ReqGrammar(self.backend.matcher(self.backend.compile(key)))
