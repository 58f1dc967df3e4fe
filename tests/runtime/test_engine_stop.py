"""Stop strings through the Engine, judged by the scheduler alone: the oracle is the Hugging Face
tokenizer's decode of the unstopped greedy output (stop at the first token whose text completes
the stop string; the text cut at its first occurrence), streamed and not."""

from __future__ import annotations

from typing import Any

import pytest
from stop_oracle import clean_span, expected, word_bias

from radixserve import Engine

PROMPT = "def main():"
PARAMS = {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(engine_model_dir):
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=2048) as eng:
        yield eng


@pytest.fixture(scope="module")
def unstopped(engine: Engine) -> dict[str, Any]:
    return engine.generate(PROMPT, PARAMS)


def check(engine: Engine, stop: str, ids: list[int], base: dict[str, Any] = PARAMS) -> None:
    """``ids``: the output of ``base`` without the stop string."""
    want_ids, want_text = expected(engine.tokenizer, ids, stop)
    params = {**base, "stop": [stop]}
    out = engine.generate(PROMPT, params)
    assert out["output_ids"] == want_ids
    assert out["text"] == want_text
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    chunks = list(engine.generate(PROMPT, params, stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == want_ids
    assert "".join(c["text"] for c in chunks) == want_text
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    engine.check_integrity()


def test_a_stop_string_longer_than_sixteen_tokens(engine: Engine, unstopped: dict) -> None:
    ids = unstopped["output_ids"]
    stop = clean_span(engine.tokenizer, ids, 8, 22)
    assert len(engine.tokenizer.encode(stop)) > 16
    check(engine, stop, ids)


def test_a_stop_string_split_across_two_tokens(engine: Engine) -> None:
    """The output biased to words: every neighbouring pair of tokens is printable."""
    tok = engine.tokenizer
    params = {**PARAMS, "logit_bias": word_bias(tok)}
    ids = engine.generate(PROMPT, params)["output_ids"]
    left, right = tok.decode(ids[4:5]), tok.decode(ids[5:6])
    assert left.strip() and right.strip() and "\ufffd" not in left + right, (left, right)
    check(engine, left[-1] + right[0], ids, params)


def test_the_last_allowed_token_completing_a_stop_string_is_a_stop(
    engine: Engine, unstopped: dict
) -> None:
    ids = unstopped["output_ids"]
    stop = clean_span(engine.tokenizer, ids, 0, 6)
    want_ids, want_text = expected(engine.tokenizer, ids, stop)
    out = engine.generate(PROMPT, {**PARAMS, "max_new_tokens": len(want_ids), "stop": [stop]})
    assert out["output_ids"] == want_ids and out["text"] == want_text
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
