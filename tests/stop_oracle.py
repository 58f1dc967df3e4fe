"""The stop-string oracle shared by the Engine and server tests: the Hugging Face tokenizer's
decode of an unstopped greedy output."""

from __future__ import annotations

from typing import Any

import pytest


def expected(tok: Any, ids: list[int], stop: str) -> tuple[list[int], str]:
    """The output ids up to the token completing ``stop``, and the text before it."""
    for k in range(len(ids)):
        text = tok.decode(ids[: k + 1], skip_special_tokens=True)
        if stop in text:
            return ids[: k + 1], text[: text.find(stop)]
    raise AssertionError(f"{stop!r} never appears")


def clean_span(tok: Any, ids: list[int], first: int, num_tokens: int) -> str:
    """The text of ``num_tokens`` output tokens from ``first`` on (or a little later), as it
    reads inside the whole output. A random model emits stray bytes: U+FFFD inside the span
    is fine (it is text), at an end the span could be half a character."""
    text = tok.decode(ids, skip_special_tokens=True)
    for start in range(first, len(ids) - num_tokens):
        a, b = (
            len(tok.decode(ids[:n], skip_special_tokens=True)) for n in (start, start + num_tokens)
        )
        span = text[a:b].strip()
        if span and "\ufffd" not in span[0] + span[-1]:
            return span
    pytest.skip("the random model's text is not usable as a stop string here")
