"""The reasoning parsers (``qwen3``, ``deepseek-r1``) on whole outputs and on streams cut
anywhere: a stream's deltas always add up to the whole output's split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api.formats.reasoning import ReasoningParser

CASES = [
    ("qwen3", "<think>\nplan\n</think>\n\nThe answer.", ("\nplan\n", "\n\nThe answer.")),
    ("qwen3", "No thinking here.", (None, "No thinking here.")),
    ("qwen3", "Text, then <think>x</think>", (None, "Text, then <think>x</think>")),
    ("qwen3", "<think>cut off by the length lim", ("cut off by the length lim", "")),
    ("qwen3", '<think>a</think><tool_call>{"name": "f"}</tool_call>', ("a", '<tool_call>{"name": "f"}</tool_call>')),
    ("qwen3", '<think>a<tool_call>{"name": "f"}', ("a", '<tool_call>{"name": "f"}')),
    ("qwen3", "\n<think>b</think>c", ("b", "c")),
    ("qwen3", "<thin", (None, "<thin")),
    ("deepseek-r1", "steps</think>42", ("steps", "42")),
    ("deepseek-r1", "<think>steps</think>42", ("steps", "42")),
    ("deepseek-r1", "all thinking", ("all thinking", "")),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "text", "expected"), CASES)
def test_whole_outputs(kind: str, text: str, expected: tuple[str | None, str]) -> None:
    assert ReasoningParser.create(kind).parse(text) == expected


def _streamed(kind: str, pieces: list[str]) -> tuple[str | None, str]:
    parser = ReasoningParser.create(kind)
    reasoning = content = ""
    for piece in pieces:
        r, c = parser.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = parser.finish()
    return (reasoning + r if parser.had_thinking else None), content + c


_PARTS = st.sampled_from(["<think>", "</think>", "<tool_call>", "\n", "a", "b c", "<", "/", ">"])


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["qwen3", "deepseek-r1"]),
    parts=st.lists(_PARTS, max_size=12),
    cuts=st.lists(st.integers(0, 60), max_size=8),
)
def test_a_stream_cut_anywhere_adds_up_to_the_whole(
    kind: str, parts: list[str], cuts: list[int]
) -> None:
    text = "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _streamed(kind, pieces) == ReasoningParser.create(kind).parse(text)


def test_an_unknown_parser_is_refused() -> None:
    with pytest.raises(ValueError, match="qwen3, deepseek-r1"):
        ReasoningParser.create("granite")
