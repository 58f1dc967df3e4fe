"""Structured output through the Engine: jump-forward changes no token, bad grammars are a
ValueError that says what is wrong (and the engine keeps serving), logprobs, the bitmask and a
rebuilt matcher against plain references."""

from __future__ import annotations

import json
import re

import pytest
import torch

from radixserve import Engine
from radixserve.runtime.grammar import (
    GrammarFactory,
    ReqGrammar,
    apply_bitmask,
    create_grammar_backend,
)

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "is_admin": {"type": "boolean"},
        "favourite_colour": {"enum": ["red", "green", "blue"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 5},
                "zip": {"type": "integer", "minimum": 0, "maximum": 99999},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "is_admin", "favourite_colour", "address"],
    "additionalProperties": False,
}
PROMPTS = ["def f(x):", "import os", "x = [1, 2", "class A:\n    pass"]
# 3,000 objects deep (Python's json module recurses ~1,000 levels), and nested bounded repeats
# past what llguidance's lexer may derive per token
DEEP_SCHEMA = '{"type": "object", "properties": {"a": ' * 3000 + "{}" + "}}" * 3000
NESTED = "(((a{1,20}){1,20}){1,20}){1,20}"


@pytest.fixture(scope="module")
def engine(engine_model_dir):
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=4096) as eng:
        yield eng


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("temperature, seed", [(0.0, None), (1.0, 123)])
def test_jump_forward_changes_no_token(engine_model_dir, overlap, temperature, seed) -> None:
    """At temperature 0 (and seeded at temperature 1) jump-forward emits the same tokens as
    decoding each forced token under the mask, in fewer steps."""
    params = {"json_schema": json.dumps(SCHEMA), "temperature": temperature, "seed": seed}
    params["max_new_tokens"] = 200
    runs = {}
    for jump in (True, False):
        with Engine(
            str(engine_model_dir),
            dtype="float32",
            max_total_tokens=4096,
            disable_jump_forward=not jump,
            disable_overlap_schedule=not overlap,
        ) as eng:
            outs = eng.generate(PROMPTS, params)
            eng.check_integrity()
            runs[jump] = ([o["output_ids"] for o in outs], eng.get_stats())
        for out in outs:
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
            assert set(json.loads(out["text"])) == set(SCHEMA["properties"])
    assert runs[True][0] == runs[False][0]
    jumped, stepped = runs[True][1], runs[False][1]
    assert jumped["num_jumped_tokens"] > 0 and stepped["num_jumped_tokens"] == 0
    steps = lambda s: s["num_decode_batches"] + s["num_jump_batches"]  # noqa: E731
    assert steps(jumped) < steps(stepped)


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"regex": "(ab"}, "invalid regex"),
        ({"regex": "[z-a]"}, "invalid regex"),
        ({"json_schema": "{not json"}, "invalid json_schema: not JSON"),
        ({"json_schema": '{"type": "frobnicate"}'}, "frobnicate"),
        ({"json_schema": "[1, 2]"}, "invalid json_schema"),
        ({"ebnf": "start: missing_rule"}, "missing_rule"),
        ({"regex": "a", "json_schema": "{}"}, "at most one of regex, json_schema and ebnf"),
        ({"regex": 5}, "regex must be a string"),
        ({"regex": r"[^\s\S]"}, "the grammar matches no text"),  # valid, but empty
        ({"json_schema": DEEP_SCHEMA}, "json_schema nests objects and arrays deeper than"),
        ({"ebnf": f"start: /{NESTED}/"}, "a regex of the ebnf grammar is too complex"),
        (
            {"json_schema": json.dumps({"type": "string", "pattern": NESTED})},
            "a json_schema pattern is too complex",
        ),
    ],
)
def test_a_bad_grammar_is_a_value_error_and_the_engine_keeps_serving(
    engine, params, fragment
) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        engine.generate("x", {**params, "max_new_tokens": 4})
    out = engine.generate("x", {"regex": "(yes|no)", "max_new_tokens": 8})
    assert out["text"] in ("yes", "no")
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": None}
    engine.check_integrity()


def test_regex_ebnf_and_json_with_logprobs(engine) -> None:
    outs = engine.generate(
        PROMPTS[:3],
        [
            {"regex": r"[0-9]{3}-[a-c]{2}", "temperature": 1.0},
            {"ebnf": 'start: "say " WORD\nWORD: /(hi|bye)/', "temperature": 1.0},
            {"json_schema": json.dumps(SCHEMA), "temperature": 0.0, "max_new_tokens": 200},
        ],
        return_logprob=True,
        top_logprobs_num=2,
    )
    assert re.fullmatch(r"[0-9]{3}-[a-c]{2}", outs[0]["text"])
    assert outs[1]["text"] in ("say hi", "say bye")
    json.loads(outs[2]["text"])
    for out in outs:
        meta = out["meta_info"]
        assert len(meta["output_token_logprobs"]) == len(out["output_ids"])  # no jump: one each
        assert all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
    engine.check_integrity()


def test_an_unconstrained_request_beside_a_constrained_one_is_unchanged(engine) -> None:
    plain = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    alone = engine.generate(PROMPTS[0], plain)
    mixed = engine.generate(PROMPTS[:2], [plain, {"regex": "[a-z]{5}", "temperature": 0.0}])
    assert mixed[0]["output_ids"] == alone["output_ids"]
    assert re.fullmatch("[a-z]{5}", mixed[1]["text"])


def test_no_tokenizer_is_a_value_error() -> None:
    """A scheduler built without a tokenizer refuses a constrained request (and only that)."""
    grammars = GrammarFactory(None, 10, [])
    assert grammars.for_key(None) is None
    with pytest.raises(ValueError, match="needs a tokenizer"):
        grammars.for_key(("regex", "a"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # numpy and torch paths
def test_apply_bitmask_equals_a_plain_loop(dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = 77  # not a multiple of 32: the last word's high bits are past the vocabulary
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 3), generator=gen, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    logits = torch.randn(3, vocab, generator=gen).to(dtype)
    got = apply_bitmask(logits, bitmask)
    assert got.dtype == dtype
    for row in range(3):
        for t in range(vocab):
            allowed = (int(bitmask[row, t // 32]) >> (t % 32)) & 1
            assert (got[row, t] == logits[row, t]) if allowed else got[row, t] == float("-inf")
    assert torch.isfinite(logits).all()  # not modified


def test_a_rebuilt_grammar_equals_one_that_never_left(tiny_tokenizer) -> None:
    backend = create_grammar_backend(tiny_tokenizer, len(tiny_tokenizer), [2])
    compiled = backend.compile(("json_schema", json.dumps(SCHEMA)))
    text = '{"name":"ab","age":7,"is_admin":true,"favourite_colour":"red","address":'
    ids = tiny_tokenizer.encode(text)

    def state(g: ReqGrammar) -> tuple[list[int], list[int]]:
        mask = torch.full((1, (len(tiny_tokenizer) + 31) // 32), -1, dtype=torch.int32)
        g.fill_bitmask(mask, 0)
        return g.forced, mask[0].tolist()

    straight = ReqGrammar(backend.matcher(compiled))
    for t in ids[:10]:
        straight.accept(t)
    moved = ReqGrammar(backend.matcher(compiled))
    for t in ids:
        moved.accept(t)
    moved.sync_to(ids[:10])  # e.g. a retraction that kept fewer tokens than the matcher saw
    assert state(moved) == state(straight)
    assert moved.num_accepted == 10


def test_without_llguidance_a_constrained_request_says_how_to_install(monkeypatch) -> None:
    import sys

    from radixserve.runtime.grammar import check_grammar

    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance -> ImportError
    monkeypatch.delitem(sys.modules, "radixserve.runtime.grammar.llguidance_backend", raising=False)
    with pytest.raises(ValueError, match=re.escape("pip install radixserve[structured]")):
        check_grammar(("regex", "a"))


def test_a_grammar_is_compiled_once_per_tenant(engine) -> None:
    """The edge's check and the scheduler's compile are cached per tenant (the request's
    namespace: ``tests/api/test_cache_scope.py``), and a salt within a tenant shares the
    tenant's."""
    params = {"regex": "[a-z]{4}q", "max_new_tokens": 8, "temperature": 0.0}
    engine.generate("def f(x):", {**params, "regex": "[0-9]"})  # the backend built
    checked, compiled = len(engine.validator.grammars), len(engine.scheduler.grammars.backend.cache)
    for key in ("tenant:a", "tenant:a|salt:s", "tenant:b", "tenant:a"):
        assert re.fullmatch(
            "[a-z]{4}q", engine.generate("def f(x):", params, extra_key=key)["text"]
        )
    assert len(engine.validator.grammars) == checked + 2
    assert len(engine.scheduler.grammars.backend.cache) == compiled + 2
