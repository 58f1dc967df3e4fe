"""Detokenizer unit tests on the real byte-level BPE tokenizer: multi-byte characters split over
tokens, stop strings spanning token boundaries, special tokens."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.runtime.io_struct import ReqOutput
from radixserve.server.detokenizer import Detokenizer, find_stop, stop_prefix_len
from radixserve.server.io_struct import DetokenizeParams, TextOutput
from radixserve.types import FinishKind, FinishReason

MULTIBYTE_TEXTS = [
    "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 end",
    "中文字符测试，日本語のテキスト、한국어 텍스트",
    "mixed: café naïve Ω≈ç√ 🚀 漢字 done",
]


def out(rid: str, ids: list[int], finish: FinishReason | None = None, n: int = 0) -> ReqOutput:
    return ReqOutput(rid, ids, finish, prompt_tokens=3, completion_tokens=n, cached_tokens=0)


def run(
    tok: Any,
    ids: list[int],
    stop: list[str] | None = None,
    skip_special: bool = True,
    finish: FinishReason | None = None,
) -> list[TextOutput]:
    """Feed ``ids`` one token per output; the last output carries ``finish`` (LENGTH)."""
    detok = Detokenizer(tok)
    detok.register(DetokenizeParams("r", stop or [], skip_special, tok.encode("Say:")))
    finish = finish or FinishReason(FinishKind.LENGTH)
    results = []
    for k, tid in enumerate(ids):
        last = k == len(ids) - 1
        res = detok.process(out("r", [tid], finish if last else None, k + 1))
        if res is not None:
            results.append(res)
    assert "r" not in detok.reqs or not results[-1].output.finish_reason
    return results


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_multibyte_text_streams_whole_characters(tiny_tokenizer: Any, text: str) -> None:
    ids = tiny_tokenizer.encode(text)
    pieces = [tiny_tokenizer.decode([t]) for t in ids]
    assert any("\ufffd" in p for p in pieces), "the test needs characters split over tokens"
    results = run(tiny_tokenizer, ids)
    deltas = [r.text for r in results]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert any(d == "" for d in deltas[:-1]), "some tokens completed no character"


def test_invalid_bytes_are_flushed_at_the_end(tiny_tokenizer: Any) -> None:
    ids = tiny_tokenizer.encode("ok 😀")
    truncated = ids[:-1]  # the emoji's last byte never comes
    results = run(tiny_tokenizer, truncated)
    text = "".join(r.text for r in results)
    assert text.startswith("ok ") and text.endswith("\ufffd")
    assert "\ufffd" not in "".join(r.text for r in results[:-1])


@pytest.mark.parametrize("stop", ["world STOP", "P here", "😀 x", "TOP"])
def test_stop_string_spanning_tokens_is_trimmed(tiny_tokenizer: Any, stop: str) -> None:
    text = "hello world STOP here 😀 x and more text after it"
    ids = tiny_tokenizer.encode(text)
    # the scheduler finishes on the stop string at the token that completes it
    results = run(tiny_tokenizer, ids, stop=[stop, "never matches"])
    joined = "".join(r.text for r in results)
    assert joined == text[: text.find(stop)]
    final = results[-1].output.finish_reason
    assert final is not None and final.kind is FinishKind.STOP_STR and final.matched == stop


def test_stop_seen_first_by_the_detokenizer_stops_early(tiny_tokenizer: Any) -> None:
    text = "alpha beta gamma delta epsilon"
    ids = tiny_tokenizer.encode(text)
    detok = Detokenizer(tiny_tokenizer)
    detok.register(DetokenizeParams("r", ["gamma"], True, []))
    outputs = [detok.process(out("r", [t], None)) for t in ids]
    emitted = [o for o in outputs if o is not None]
    assert emitted[-1].stopped_early
    assert emitted[-1].output.finish_reason == FinishReason(FinishKind.STOP_STR, "gamma")
    assert "".join(o.text for o in emitted) == "alpha beta "
    # the scheduler's abort output that follows is dropped, and the state with it
    assert detok.process(out("r", [], FinishReason(FinishKind.ABORT))) is None
    assert "r" not in detok.reqs


def test_held_back_stop_prefix_is_released_when_it_does_not_match(tiny_tokenizer: Any) -> None:
    ids = tiny_tokenizer.encode("x = 1 # end of line")
    results = run(tiny_tokenizer, ids, stop=["# stop"])
    assert "".join(r.text for r in results) == "x = 1 # end of line"
    before_final = "".join(r.text for r in results[:-1])
    assert not before_final.endswith("#"), "a possible stop prefix was held back"


def test_skip_special_tokens(tiny_tokenizer: Any) -> None:
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tiny_tokenizer.encode("hi there") + [im_end]
    stop_token = FinishReason(FinishKind.STOP_TOKEN, im_end)
    skipped = run(tiny_tokenizer, ids, finish=stop_token)
    kept = run(tiny_tokenizer, ids, skip_special=False, finish=stop_token)
    assert "".join(r.text for r in skipped) == "hi there"
    assert "".join(r.text for r in kept) == "hi there<|im_end|>"


def test_batches_keep_requests_apart(tiny_tokenizer: Any) -> None:
    detok = Detokenizer(tiny_tokenizer)
    a, b = tiny_tokenizer.encode("日本語 one"), tiny_tokenizer.encode("🎉 two")
    msgs: list[object] = [DetokenizeParams("a", [], True, []), DetokenizeParams("b", [], True, [])]
    texts = {"a": "", "b": ""}
    for k in range(max(len(a), len(b))):
        batch: list[object] = list(msgs)
        msgs = []
        for rid, ids in (("a", a), ("b", b)):
            if k < len(ids):
                done = FinishReason(FinishKind.LENGTH) if k == len(ids) - 1 else None
                batch.append(out(rid, [ids[k]], done))
        for res in detok.handle(batch):
            assert isinstance(res, TextOutput)
            texts[res.output.rid] += res.text
    assert texts == {"a": "日本語 one", "b": "🎉 two"}
    assert detok.reqs == {}


def test_stop_helpers() -> None:
    assert find_stop("abcabc", ["ca", "b"]) == (1, "b")
    assert find_stop("abc", ["x"]) is None
    assert stop_prefix_len("hello wor", ["world"]) == 3
    assert stop_prefix_len("hello", ["world"]) == 0
    assert stop_prefix_len("ab", ["abc", "bcd"]) == 2
