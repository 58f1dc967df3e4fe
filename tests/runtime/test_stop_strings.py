"""The scheduler's stop-string judge against the oracle: the Hugging Face tokenizer's decode of
the whole output, checked after every token (long stop strings, strings split across tokens,
multi-byte characters, skipped special tokens)."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.runtime.stop_strings import match_stop_str

PROMPT = "Say:"
TEXTS = [
    "def main():\n    for i in range(10):\n        print(i, 'hello world')\n    return None\n",
    "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 end, then 中文字符测试，日本語のテキスト、한국어 텍스트",
    "mixed: café naïve Ω≈ç√ 🚀 漢字 done; the rest of the line is plain ASCII text again",
]


def oracle(tok: Any, ids: list[int], stops: list[str], skip: bool = True) -> tuple[int, str]:
    """The first token after which the decoded output holds a stop string, and which one
    (the earliest match)."""
    for k in range(len(ids)):
        text = tok.decode(ids[: k + 1], skip_special_tokens=skip)
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            return k, min(hits)[1]
    return -1, ""


def judge(tok: Any, ids: list[int], stops: list[str], skip: bool = True) -> tuple[int, str]:
    prompt = tok.encode(PROMPT)
    for k in range(len(ids)):
        matched = match_stop_str(tok, prompt, ids[: k + 1], stops, skip)
        if matched is not None:
            return k, matched
    return -1, ""


def stops_of(text: str) -> list[str]:
    """Substrings of ``text``: short and long, at several places, none with a cut character."""
    out = []
    for length in (1, 2, 3, 7, 20, 45):
        for start in (0, 3, len(text) // 3, len(text) - length - 1):
            if 0 <= start and start + length <= len(text):
                out.append(text[start : start + length])
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_the_judge_stops_where_the_decoded_output_first_holds_the_stop(
    tiny_tokenizer: Any, text: str
) -> None:
    ids = tiny_tokenizer.encode(text)
    for stop in stops_of(text):
        assert judge(tiny_tokenizer, ids, [stop]) == oracle(tiny_tokenizer, ids, [stop]), stop
    # several stops at once: the earliest match wins, as the detokenizer cuts there
    many = [text[-10:], text[5:9], text[4:30]]
    assert judge(tiny_tokenizer, ids, many) == oracle(tiny_tokenizer, ids, many)


def test_a_stop_string_much_longer_than_a_few_tokens(tiny_tokenizer: Any) -> None:
    text = TEXTS[0] * 3
    ids = tiny_tokenizer.encode(text)
    stop = text[10:150]
    num_tokens = len(tiny_tokenizer.encode(stop))
    assert num_tokens > 16, "the stop string must span more than the old 16-token tail"
    k, matched = judge(tiny_tokenizer, ids, [stop])
    assert (k, matched) == oracle(tiny_tokenizer, ids, [stop]) and matched == stop
    assert stop in tiny_tokenizer.decode(ids[: k + 1]) and stop not in tiny_tokenizer.decode(
        ids[:k]
    )


def test_a_stop_string_split_inside_multibyte_characters(tiny_tokenizer: Any) -> None:
    text = TEXTS[1]
    ids = tiny_tokenizer.encode(text)
    assert any("\ufffd" in tiny_tokenizer.decode([t]) for t in ids), "characters split over tokens"
    for stop in ("😀🎉", "👍🏽 and", "日本語", "텍"):
        k, matched = judge(tiny_tokenizer, ids, [stop])
        assert matched == stop and (k, matched) == oracle(tiny_tokenizer, ids, [stop])


def test_special_tokens_count_as_the_client_sees_them(tiny_tokenizer: Any) -> None:
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tiny_tokenizer.encode("hi there") + [im_end] + tiny_tokenizer.encode(" friend")
    # skipped: the text reads "hi there friend"; kept: "hi there<|im_end|> friend"
    assert judge(tiny_tokenizer, ids, ["there friend"], skip=True)[1] == "there friend"
    assert judge(tiny_tokenizer, ids, ["there friend"], skip=False) == (-1, "")
    kept = judge(tiny_tokenizer, ids, ["there<|im_end|>"], skip=False)
    assert kept == oracle(tiny_tokenizer, ids, ["there<|im_end|>"], skip=False)
    assert kept[1] == "there<|im_end|>"


def test_a_long_run_of_invisible_tokens_widens_the_tail(tiny_tokenizer: Any) -> None:
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tiny_tokenizer.encode("abc") + [im_end] * 60 + tiny_tokenizer.encode("def")
    for stop in ("abcdef", "cd", "def"):
        assert judge(tiny_tokenizer, ids, [stop]) == oracle(tiny_tokenizer, ids, [stop])
    assert judge(tiny_tokenizer, ids, ["abcdef"])[1] == "abcdef"
