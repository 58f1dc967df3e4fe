"""The stop-string oracle shared by the Engine and server tests: the Hugging Face tokenizer's
decode of an unstopped greedy output."""

from __future__ import annotations

import re
from typing import Any

WORD = re.compile(r" [a-z]{3,}")


def word_bias(tok: Any, n: int = 16) -> dict[int, float]:
    """A logit bias that makes a random model write words: +100 on the first ``n`` tokens that
    each decode to a space and three or more ASCII letters. The model still picks among them,
    but every token it outputs is then printable text."""
    ids = [i for i in range(len(tok)) if WORD.fullmatch(tok.decode([i]))][:n]
    assert len(ids) == n, f"the tokenizer has {len(ids)} word tokens"
    return dict.fromkeys(ids, 100.0)


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
    raise AssertionError(f"no {num_tokens} tokens from {first} on read as clean text: {text!r}")
