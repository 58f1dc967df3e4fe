"""Structured output: grammars (regex, JSON schema, EBNF/Lark) compiled by a
:class:`GrammarBackend`, a per-request :class:`ReqGrammar`, the batch's token bitmask.

See ``docs/structured_output.md``.
"""

from radixserve.runtime.grammar.backend import GrammarBackend, GrammarKey, GrammarMatcher
from radixserve.runtime.grammar.bitmask import apply_bitmask, fill_batch_bitmask
from radixserve.runtime.grammar.factory import GrammarFactory, check_grammar, create_grammar_backend
from radixserve.runtime.grammar.req_grammar import ReqGrammar

__all__ = [
    "GrammarBackend",
    "GrammarFactory",
    "GrammarKey",
    "GrammarMatcher",
    "ReqGrammar",
    "apply_bitmask",
    "check_grammar",
    "create_grammar_backend",
    "fill_batch_bitmask",
]
