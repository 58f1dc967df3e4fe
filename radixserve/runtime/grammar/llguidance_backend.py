"""The :class:`GrammarBackend` on llguidance (Rust, no torch or triton dependency).

Importing this module imports llguidance: ``backend.py`` does it lazily.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import llguidance
import torch

from radixserve.runtime.grammar.backend import KINDS, CompileCache, GrammarKey
from radixserve.runtime.grammar.llguidance_tokenizer import llguidance_tokenizer

# JSON is written compactly with a fixed layout, so that keys and punctuation are forced
# (jump-forward skips them) and every output parses with json.loads
_JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def grammar_source(key: GrammarKey) -> str:
    """llguidance's grammar text of ``key``, validated (no tokenizer needed): ``ValueError``
    that names the problem."""
    kind, source = key
    if kind not in KINDS:
        raise ValueError(f"unknown grammar kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(source)
    elif kind == "ebnf":
        grammar = llguidance.LLMatcher.grammar_from_lark(source)
    else:
        schema = {"type": "object"} if kind == "json_object" else _parse_schema(source)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        except ValueError as exc:
            raise ValueError(f"invalid json_schema: {exc}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"invalid {kind}: {messages[0] if messages else 'rejected'}")
    return grammar


def _parse_schema(source: str) -> Any:
    try:
        schema = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid json_schema: not JSON ({exc})") from None
    if not isinstance(schema, dict | bool):
        raise ValueError("invalid json_schema: a schema is a JSON object or a boolean")
    return schema


class LLGuidanceMatcher:
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._m = matcher

    def accept_token(self, token: int) -> bool:
        if self._m.validate_tokens([token]) != 1:
            return False
        return bool(self._m.consume_token(token))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        words = bitmask[row]
        self._m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())

    def is_terminated(self) -> bool:
        return bool(self._m.is_stopped())

    def forced_tokens(self) -> list[int]:
        forced = list(self._m.compute_ff_tokens())
        return forced[: self._m.validate_tokens(forced)]  # only what the matcher will accept

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def reset(self) -> None:
        self._m.reset()


class LLGuidanceBackend:
    """Grammars for one tokenizer; ``vocab_size`` is the model's (the bitmask's width)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self.tokenizer = llguidance_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.vocab_size = vocab_size
        self._cache = CompileCache(grammar_source)

    def compile(self, key: GrammarKey) -> str:
        return str(self._cache.get(key))

    def matcher(self, compiled: Any) -> LLGuidanceMatcher:
        m = llguidance.LLMatcher(self.tokenizer, compiled, log_level=0)
        # a grammar that matches no text shows up as an error once its first mask is computed
        m.compute_bitmask()
        if m.is_error():
            reason = (m.get_error().splitlines() or ["rejected"])[0]
            raise ValueError(f"the grammar matches no text this tokenizer can write ({reason})")
        return LLGuidanceMatcher(m)
