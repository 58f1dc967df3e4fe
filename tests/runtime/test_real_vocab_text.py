"""Text over real checkpoints' vocabularies (Qwen3, Llama 3.1).

- Detokenization: for random token streams (multi-byte characters whose bytes fall in
  different tokens, byte tokens, special and added tokens, any id of the vocabulary), fed in
  random pieces, the streamed text equals the one-shot decode, with ``skip_special_tokens``
  true and false.
- Ends: a request stops on every EOS id the checkpoint's ``generation_config.json`` lists, and
  on a stop string that spans tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve import Engine
from radixserve.server.detokenizer import IncrementalDecoder

TEXTS = st.lists(
    st.sampled_from(list("ab é日本語🙂\n\t€ж") + ["<think>", "</tool_call>", "  "]), max_size=16
).map("".join)


@st.composite
def token_streams(draw: st.DrawFn, tokenizer: Any) -> list[int]:
    out: list[int] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["text", "text", "special", "any"]))
        if kind == "text":
            out += tokenizer.encode(draw(TEXTS), add_special_tokens=False)
        elif kind == "special":
            out.append(draw(st.sampled_from(sorted(tokenizer.added_tokens_decoder))))
        else:
            out.append(draw(st.integers(0, len(tokenizer) - 1)))
    return out


def _check_stream(tokenizer: Any, data: st.DataObject, skip: bool) -> None:
    context = tokenizer.encode(data.draw(TEXTS, "prompt"), add_special_tokens=False)[-5:]
    ids = data.draw(token_streams(tokenizer), "ids")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=6), "cuts"))
    bounds = [0, *cuts, len(ids)]
    decoder = IncrementalDecoder(tokenizer, context, skip)
    streamed = "".join(
        decoder.add(ids[a:b], final=(b == len(ids) and i == len(bounds) - 2))
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))
    )
    before = tokenizer.decode(context, skip_special_tokens=skip)
    whole = tokenizer.decode(context + ids, skip_special_tokens=skip)
    if not whole.startswith(before):  # the prompt's tail ends inside a character
        return
    assert streamed == whole[len(before) :], (context, ids, cuts)


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
def test_streamed_text_equals_the_one_shot_decode(
    checkpoint_tokenizers: dict[str, Any], family: str, skip: bool
) -> None:
    tokenizer = checkpoint_tokenizers[family]

    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _check_stream(tokenizer, data, skip)

    check()


@pytest.mark.parametrize("fixture", ["qwen3_model_dir", "llama3_model_dir"])
def test_every_listed_eos_id_ends_a_request(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    listed = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    assert len(listed) >= 2
    with Engine(str(model_dir), dtype="float32") as engine:
        for eos in listed:  # a logit bias makes the random model write that id first
            params = {"max_new_tokens": 8, "temperature": 0.0, "logit_bias": {eos: 100.0}}
            out = engine.generate("Hello", params)
            reason = out["meta_info"]["finish_reason"]
            assert reason == {"type": "stop", "matched": eos}, (eos, out)
            assert out["meta_info"]["completion_tokens"] == 1
        engine.check_integrity()


def test_a_stop_string_that_spans_tokens(qwen3_model_dir: Path) -> None:
    pytest.importorskip("llguidance")
    with Engine(str(qwen3_model_dir), dtype="float32") as engine:
        tokens = engine.tokenizer.encode("alpha beta gamma", add_special_tokens=False)  # type: ignore[attr-defined]
        assert len(tokens) >= 3
        params = {"regex": "alpha beta gamma", "max_new_tokens": 16, "stop": ["ha be"]}
        out = engine.generate("Say it:", params)
    assert out["text"] == "alp"
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "ha be"}
