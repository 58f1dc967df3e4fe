"""No request can take the scheduler down: an exception of one request's own objects (its
grammar accepting a token or filling the batch's mask, its sampling parameters, its
stop-string check, its detokenization) ends that request with an error, frees its KV, and the
others are served on.

Each test injects the fault into one request of a batch on the real scheduler and model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixserve import Engine
from radixserve.runtime import output_processor
from radixserve.runtime.grammar.req_grammar import ReqGrammar
from radixserve.runtime.io_struct import ReqOutput
from radixserve.runtime.sampling_batch_info import SamplingBatchInfo
from radixserve.server.detokenizer import Detokenizer
from radixserve.server.io_struct import ReqError, TextOutput
from radixserve.types import FinishKind, FinishReason

pytest.importorskip("llguidance")

PROMPTS = ["def f(x):", "import os\n", "class A:\n", "x = ["]
BAD = "fault"  # the one request whose objects fail carries this stop string or this regex
GOOD_REGEX = "[a-z]{3,6}"
BAD_REGEX = "[a-z]{3,7}"


@pytest.fixture(params=["overlap", "no-overlap"])
def engine(engine_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    no_overlap = request.param == "no-overlap"
    with Engine(str(engine_model_dir), dtype="float32", disable_overlap_schedule=no_overlap) as eng:
        yield eng


def _grammar_params(regexes: list[str]) -> list[dict]:
    return [{"regex": r, "max_new_tokens": 12, "temperature": 0.0} for r in regexes]


def _check(engine: Engine, outs: list[dict], bad: int) -> None:
    for i, out in enumerate(outs):
        reason = out["meta_info"]["finish_reason"]
        if i == bad:
            assert reason["type"] == "abort" and "internal error" in reason["message"], reason
        else:
            assert reason["type"] in ("stop", "length"), (i, reason)
    assert engine.get_stats()["num_failed_reqs"] == 1
    engine.check_integrity()
    again = engine.generate(PROMPTS[0], {"max_new_tokens": 4})  # still serving
    assert again["meta_info"]["finish_reason"]["type"] == "length"


def test_a_grammar_that_refuses_a_token_fails_its_request_only(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = ReqGrammar.accept

    def accept(self: ReqGrammar, token: int) -> None:
        if self.num_accepted == 2 and self.matcher.failing:  # type: ignore[attr-defined]
            raise AssertionError(f"token {token} was sampled outside its grammar")
        original(self, token)

    monkeypatch.setattr(ReqGrammar, "accept", accept)
    _mark_failing_matchers(engine, monkeypatch)
    regexes = [GOOD_REGEX, BAD_REGEX, GOOD_REGEX, GOOD_REGEX]
    _check(engine, engine.generate(PROMPTS, _grammar_params(regexes)), bad=1)


def test_a_grammar_that_cannot_fill_its_mask_fails_its_request_only(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = ReqGrammar.fill_bitmask

    def fill(self: ReqGrammar, bitmask, row: int) -> None:  # type: ignore[no-untyped-def]
        if self.matcher.failing:  # type: ignore[attr-defined]
            raise RuntimeError("the matcher is in an error state")
        original(self, bitmask, row)

    monkeypatch.setattr(ReqGrammar, "fill_bitmask", fill)
    _mark_failing_matchers(engine, monkeypatch)
    regexes = [GOOD_REGEX, GOOD_REGEX, BAD_REGEX, GOOD_REGEX]
    _check(engine, engine.generate(PROMPTS, _grammar_params(regexes)), bad=2)


def test_a_stop_check_that_raises_fails_its_request_only(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = output_processor.match_stop_str

    def match(tokenizer, prompt, output, matcher, skip):  # type: ignore[no-untyped-def]
        if BAD in matcher.stops and len(output) >= 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return original(tokenizer, prompt, output, matcher, skip)

    monkeypatch.setattr(output_processor, "match_stop_str", match)
    params = [{"max_new_tokens": 10, "stop": ["zzzz"]} for _ in PROMPTS]
    params[0]["stop"] = [BAD]
    _check(engine, engine.generate(PROMPTS, params), bad=0)


def test_sampling_parameters_that_cannot_be_built_fail_their_request_only(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = SamplingBatchInfo.from_params.__func__  # type: ignore[attr-defined]

    def from_params(cls, params, *args, **kwargs):  # type: ignore[no-untyped-def]
        if any(p.seed == 666 for p in params):
            raise RuntimeError("a row's sampling state could not be built")
        return original(cls, params, *args, **kwargs)

    monkeypatch.setattr(SamplingBatchInfo, "from_params", classmethod(from_params))
    params = [{"max_new_tokens": 6, "seed": s} for s in (1, 2, 666, 3)]
    _check(engine, engine.generate(PROMPTS, params), bad=2)


def _mark_failing_matchers(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every matcher made for BAD_REGEX says so (``matcher.failing``)."""
    grammars = engine.scheduler.grammars  # type: ignore[attr-defined]
    original = grammars.for_key

    def for_key(key, after_token=None, scope=None):  # type: ignore[no-untyped-def]
        grammar = original(key, after_token, scope)
        if grammar is not None:
            grammar.matcher.failing = key == ("regex", BAD_REGEX)
        return grammar

    monkeypatch.setattr(grammars, "for_key", for_key)


class _FailingTokenizer:
    """Decodes ids as letters; id 99 cannot be decoded."""

    def decode(self, ids: list[int], **kwargs: object) -> str:
        if 99 in ids:
            raise ValueError("token 99 has no text")
        return "".join(chr(ord("a") + i % 26) for i in ids)


def _out(rid: str, ids: list[int], reason: FinishReason | None = None) -> ReqOutput:
    return ReqOutput(rid, ids, reason, prompt_tokens=3, completion_tokens=len(ids), cached_tokens=0)


def test_a_request_that_cannot_be_detokenized_fails_alone() -> None:
    detok = Detokenizer(_FailingTokenizer())
    length = FinishReason(FinishKind.LENGTH)
    out = detok.handle([_out("good", [1, 2]), _out("bad", [3, 99]), _out("good", [4], length)])
    assert isinstance(out[0], TextOutput) and isinstance(out[2], TextOutput)
    assert out[0].text + out[2].text == "bce"
    assert isinstance(out[1], ReqError) and out[1].status_code == 500
    assert "token 99 has no text" in out[1].message
    assert detok.reqs == {}  # neither request's state is left behind
