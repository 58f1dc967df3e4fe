"""The scheduler's and the edge's way to grammars: the backend built on llguidance, a grammar
checked without a tokenizer, a request's :class:`ReqGrammar`.

llguidance is an optional extra, imported lazily: without it a constrained request is a
``ValueError`` (HTTP 400) that says how to install it, and a server without constrained
requests never imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from radixserve.runtime.grammar.backend import GrammarBackend, GrammarKey
from radixserve.runtime.grammar.req_grammar import ReqGrammar
from radixserve.runtime.io_struct import GenerateRequest, cache_scope

MISSING = "structured output needs `pip install radixserve[structured]` (llguidance)"


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

    def for_key(
        self, key: GrammarKey | None, after_token: int | None = None, scope: str | None = None
    ) -> ReqGrammar | None:
        """``None`` without a key; ``ValueError`` for a grammar this tokenizer cannot run.
        ``after_token``: the grammar starts after that token (see :class:`ReqGrammar`);
        ``scope``: the request's cache scope (compiled grammars are cached in each apart)."""
        if key is None:
            return None
        if self.backend is None:
            self.backend = create_grammar_backend(*self._args)
        return ReqGrammar(self.backend.matcher(self.backend.compile(key, scope)), after_token)

    def for_request(self, request: GenerateRequest) -> ReqGrammar | None:
        """:meth:`for_key` of ``request``'s grammar, in its cache scope."""
        params = request.sampling_params
        scope = cache_scope(request.extra_key)
        return self.for_key(params.grammar_key, params.grammar_after_token, scope)
