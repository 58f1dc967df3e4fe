"""Grammars over real checkpoints' vocabularies (Qwen3: 151,669 ids, 26 added tokens, a model
vocabulary of 151,936 rows; Llama 3.1: 128,256 ids, 256 reserved special tokens).

The property: every token a request's mask allows, its matcher accepts, at every step of a
random walk through random grammars that spell added tokens' texts (``<think>``,
``<tool_call>``, ``<|im_end|>``, ``<|python_tag|>``), multi-byte characters and JSON; no id
past the tokenizer is ever allowed. A disagreement would end the request: Qwen3's ``<think>``
allowed as one token by the mask and refused by the matcher, for instance."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.runtime.grammar import ReqGrammar, check_grammar, create_grammar_backend
from radixserve.runtime.grammar.bitmask import bitmask_width
from tests.runtime.grammar_strategies import dumps, json_schemas, nested_repeats, regexes

pytest.importorskip("llguidance")

VOCAB = {"qwen3": 151936, "llama3": 128256}  # the models' embedding rows
EOS = {"qwen3": ["<|im_end|>", "<|endoftext|>"], "llama3": ["<|eot_id|>", "<|eom_id|>"]}
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "<|python_tag|>"]
_ATOMS = st.sampled_from(
    [re.escape(t) for t in ADDED] + ["\\n", "[a-c]", "[0-9]", " ", "é", "日本", '\\{"a": 1\\}']
)
SAMPLED = 48  # allowed tokens checked per step, besides every allowed added or special one
PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def backends(checkpoint_tokenizers: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for family, tok in checkpoint_tokenizers.items():
        eos = [tok.convert_tokens_to_ids(t) for t in EOS[family]]
        out[family] = (tok, create_grammar_backend(tok, VOCAB[family], eos))
    return out


def _allowed(grammar: ReqGrammar, vocab: int) -> np.ndarray:
    bitmask = torch.zeros(1, bitmask_width(vocab), dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), count=vocab, bitorder="little")
    return np.flatnonzero(bits)


def _walk(family: str, key: tuple[str, str], backends: dict[str, Any], data: st.DataObject) -> None:
    tok, backend = backends[family]
    vocab, tokenizer_len = VOCAB[family], len(tok)
    added = set(tok.added_tokens_decoder)
    grammar = ReqGrammar(backend.matcher(backend.compile(key)))
    for _ in range(40):
        if grammar.is_terminated():
            return
        allowed = _allowed(grammar, vocab)
        assert len(allowed) and allowed[-1] < vocab
        assert not (allowed >= tokenizer_len).any(), "an id past the tokenizer was allowed"
        picks = {int(t) for t in allowed if int(t) in added}
        picks |= set(data.draw(st.lists(st.sampled_from(allowed.tolist()), max_size=SAMPLED)))
        for token in sorted(picks):
            assert grammar.matcher.accept_token(token), (key, token, tok.decode([token]))
            grammar.matcher.rollback(1)
        grammar.accept(data.draw(st.sampled_from(allowed.tolist())))  # raises if refused


@PROPERTY
@given(family=st.sampled_from(sorted(VOCAB)), pattern=regexes(atoms=_ATOMS), data=st.data())
def test_every_token_a_regex_mask_allows_its_matcher_accepts(
    backends: dict[str, Any], family: str, pattern: str, data: st.DataObject
) -> None:
    _walk(family, ("regex", pattern), backends, data)


@pytest.mark.timeout(240)
@PROPERTY
@given(family=st.sampled_from(sorted(VOCAB)), pattern=nested_repeats(), data=st.data())
def test_nested_bounded_repeats_are_refused_or_walk_without_a_matcher_error(
    backends: dict[str, Any], family: str, pattern: str, data: st.DataObject
) -> None:
    """Nested bounded repeats multiply what llguidance's lexer derives per token: a regex over
    the limit is refused at submission (by the edge's check, or when its matcher is made);
    any other walks with no step over llguidance's budget (an exceeded one left the matcher
    in an error state whose mask allowed only EOS, which it refused)."""
    key = ("regex", pattern)
    backend = backends[family][1]
    try:
        check_grammar(key)
        backend.matcher(backend.compile(key))
    except ValueError as exc:
        assert "too complex" in str(exc), exc
        return
    _walk(family, key, backends, data)


@PROPERTY
@given(family=st.sampled_from(sorted(VOCAB)), schema=json_schemas(), data=st.data())
def test_every_token_a_schema_mask_allows_its_matcher_accepts(
    backends: dict[str, Any], family: str, schema: dict[str, Any], data: st.DataObject
) -> None:
    _walk(family, ("json_schema", dumps(schema)), backends, data)


@pytest.mark.parametrize(
    "pattern",
    [
        "<think>\\n[a-z]{4}\\n</think>\\n\\n[a-z]+",
        '<tool_call>\\n\\{"name": "[a-z]+"\\}\\n</tool_call>',
    ],
)
def test_qwen3_added_tokens_in_a_regex_are_the_models_own_tokens(
    backends: dict[str, Any], pattern: str
) -> None:
    """``<think>`` and ``<tool_call>`` are not special in Qwen3's tokenizer: a grammar that
    forces their text lets the model write the one token it was trained on, and accepts it."""
    tok, backend = backends["qwen3"]
    grammar = ReqGrammar(backend.matcher(backend.compile(("regex", pattern))))
    opener = tok.convert_tokens_to_ids(pattern.split("\\n")[0])
    assert grammar.forced[0] == opener and opener in _allowed(grammar, VOCAB["qwen3"])
    grammar.accept(opener)


def test_special_tokens_in_a_regex_are_spelled_as_text(backends: dict[str, Any]) -> None:
    """A special token's text in a grammar is text: ``<|im_end|>`` (an end-of-sequence id) is
    written in ordinary pieces, never as the special token, which would end the request."""
    tok, backend = backends["qwen3"]
    grammar = ReqGrammar(backend.matcher(backend.compile(("regex", "x<\\|im_end\\|>y"))))
    special = set(tok.all_special_ids)
    assert grammar.forced and not special & set(grammar.forced)
    assert tok.decode(grammar.forced) == "x<|im_end|>y"


def test_a_grammar_after_the_thinking_waits_for_its_end(backends: dict[str, Any]) -> None:
    """With ``after_token`` (``</think>``) every token is allowed until that one; then the
    schema constrains; a rebuild from the output (retraction) lands in the same state."""
    tok, backend = backends["qwen3"]
    think_end = tok.convert_tokens_to_ids("</think>")
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    key = ("json_schema", schema)
    grammar = ReqGrammar(backend.matcher(backend.compile(key)), after_token=think_end)
    free = tok.encode("plain words, no JSON", add_special_tokens=False)
    for token in free:
        assert len(_allowed(grammar, VOCAB["qwen3"])) == VOCAB["qwen3"]
        assert not grammar.forced and not grammar.is_terminated()
        grammar.accept(token)
    grammar.accept(think_end)
    assert tok.decode(grammar.forced).startswith('{"a')  # now the schema's
    assert len(_allowed(grammar, VOCAB["qwen3"])) == 1
    rebuilt = ReqGrammar(backend.matcher(backend.compile(key)), after_token=think_end)
    rebuilt.sync_to([*free, think_end])
    assert rebuilt.forced == grammar.forced and not rebuilt.waiting


def test_structured_output_starts_after_the_thinking_end_to_end(qwen3_model_dir) -> None:  # type: ignore[no-untyped-def]
    """The engine on the Qwen3-shaped model: a schema that starts after ``</think>`` (which a
    logit bias makes the random model write first) leaves that token free and binds the rest."""
    import json

    from radixserve import Engine

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    with Engine(str(qwen3_model_dir), dtype="float32") as engine:
        think_end = engine.tokenizer.convert_tokens_to_ids("</think>")  # type: ignore[attr-defined]
        params = {
            "json_schema": json.dumps(schema),
            "grammar_after_token": think_end,
            "logit_bias": {think_end: 100.0},
            "max_new_tokens": 40,
            "temperature": 0.0,
        }
        out = engine.generate("Answer in JSON:", params)
        engine.check_integrity()
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    assert out["text"].startswith("</think>")
    assert isinstance(json.loads(out["text"][len("</think>") :])["ok"], bool)


@pytest.mark.timeout(300)
def test_deeply_nested_repeats_complete_or_are_refused_at_submission(qwen3_model_dir) -> None:  # type: ignore[no-untyped-def]
    """The Qwen3-shaped model on ``(((a{1,20}){1,20}){1,20}){1,20}``, its EOS tokens pushed away
    so the walk goes deep: refused at submission with a ``ValueError``, or it completes with
    text that matches; never a failure mid-generation."""
    from radixserve import Engine

    pattern = "(((a{1,20}){1,20}){1,20}){1,20}"
    with Engine(str(qwen3_model_dir), dtype="float32") as engine:
        eos = engine.tokenizer.convert_tokens_to_ids(EOS["qwen3"])  # type: ignore[attr-defined]
        bias = {t: -100.0 for t in eos}
        params = {"regex": pattern, "logit_bias": bias, "max_new_tokens": 48, "seed": 1}
        try:
            outs = engine.generate(["Say a:", "Many a:"], params)
        except ValueError as exc:
            assert "too complex" in str(exc), exc
            outs = []
        engine.check_integrity()
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length"), out
        assert re.fullmatch("a+", out["text"]), out  # any run of up to 160,000 a's matches
