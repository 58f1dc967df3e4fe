"""The :class:`GrammarBackend` on llguidance (Rust, no torch or triton dependency).

Importing this module imports llguidance: ``backend.py`` does it lazily.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import llguidance
import torch

from radixserve.runtime.grammar.backend import KINDS, CompileCache, GrammarKey
from radixserve.runtime.grammar.limits import (
    check_regex_repeats,
    lark_regexes,
    parse_json_schema,
    schema_patterns,
)
from radixserve.runtime.grammar.llguidance_tokenizer import llguidance_tokenizer

# JSON is written compactly with a fixed layout, so that keys and punctuation are forced
# (jump-forward skips them) and every output parses with json.loads
_JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# llguidance's default lexer budget per token (200,000: about 14 ms) is exceeded at the first
# tokens of small repeats of whitespace over real vocabularies (tokens of up to 128 spaces);
# five times as much (about 70 ms at worst, per request and token) leaves the edge's limits a
# margin (limits.py)
_PARSER_LIMITS = llguidance.LLParserLimits(step_lexer_fuel=1_000_000)
# llguidance's stop reasons for a grammar that outgrew its limits (not one that is wrong)
_OVER_LIMITS = frozenset({"LexerTooComplex", "ParserTooComplex"})


def grammar_source(key: GrammarKey) -> str:
    """llguidance's grammar text of ``key``, validated (no tokenizer needed): ``ValueError``
    that names the problem."""
    kind, source = key
    if kind not in KINDS:
        raise ValueError(f"unknown grammar kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "regex":
        check_regex_repeats(source)
        grammar = llguidance.LLMatcher.grammar_from_regex(source)
    elif kind == "ebnf":
        for pattern in lark_regexes(source):
            check_regex_repeats(pattern, "a regex of the ebnf grammar")
        grammar = llguidance.LLMatcher.grammar_from_lark(source)
    else:
        schema = {"type": "object"} if kind == "json_object" else parse_json_schema(source)
        for pattern in schema_patterns(schema):
            check_regex_repeats(pattern, "a json_schema pattern")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        except ValueError as exc:
            raise ValueError(f"invalid json_schema: {exc}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"invalid {kind}: {messages[0] if messages else 'rejected'}")
    return grammar


class GrammarLimitError(RuntimeError):
    """llguidance gave up on a grammar while generating (a limit of its lexer or parser per
    step): the request ends with this error; the edge's checks keep known shapes from it."""


class LLGuidanceMatcher:
    """A request's llguidance matcher. llguidance reports a grammar it gave up on as an error
    state, where ``is_stopped`` is true and the mask allows only EOS, which it refuses: every
    method here raises :class:`GrammarLimitError` instead of reporting that state."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._m = matcher

    def accept_token(self, token: int) -> bool:
        if self._m.validate_tokens([token]) != 1:
            self._raise_if_error()
            return False
        ok = bool(self._m.consume_token(token))
        self._raise_if_error()
        return ok

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        words = bitmask[row]
        self._m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        self._raise_if_error()

    def is_terminated(self) -> bool:
        self._raise_if_error()
        return bool(self._m.is_stopped())

    def forced_tokens(self) -> list[int]:
        forced = list(self._m.compute_ff_tokens())
        self._raise_if_error()
        return forced[: self._m.validate_tokens(forced)]  # only what the matcher will accept

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def reset(self) -> None:
        self._m.reset()

    def _raise_if_error(self) -> None:
        if self._m.is_error():
            raise GrammarLimitError(
                f"the grammar engine gave up on this grammar while generating ({_reason(self._m)})"
            )


def _reason(matcher: llguidance.LLMatcher) -> str:
    return (matcher.get_error().splitlines() or ["rejected"])[0]


class LLGuidanceBackend:
    """Grammars for one tokenizer; ``vocab_size`` is the model's (the bitmask's width)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self.tokenizer = llguidance_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.vocab_size = vocab_size
        self.cache = CompileCache(grammar_source)  # compiled grammars, per scope

    def compile(self, key: GrammarKey, scope: str | None = None) -> str:
        return str(self.cache.get(key, scope))

    def matcher(self, compiled: Any) -> LLGuidanceMatcher:
        m = llguidance.LLMatcher(self.tokenizer, compiled, log_level=0, limits=_PARSER_LIMITS)
        # a grammar that matches no text, or outgrows llguidance's limits at its first token,
        # shows up as an error once its first mask and forced tokens are computed
        m.compute_bitmask()
        m.compute_ff_tokens()
        if m.is_error():
            if m.stop_reason() in _OVER_LIMITS:
                raise ValueError(
                    f"the grammar is too complex for the grammar engine ({_reason(m)})"
                )
            raise ValueError(f"the grammar matches no text this tokenizer can write ({_reason(m)})")
        return LLGuidanceMatcher(m)
