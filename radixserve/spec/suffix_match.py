"""Prompt lookup: the continuation of a sequence's latest tokens found earlier in the sequence.

``suffix_match(tokens, min_n, max_n, k)`` looks for earlier places where the last ``n`` tokens
(``min_n <= n <= max_n``) occurred and proposes the up to ``k`` tokens that followed. The longest
match wins; among equally long ones, the most recent place whose continuation holds all ``k``
tokens (a loop repeats its most recent turn), else the earliest (whose continuation is the
longest there is). A match may overlap the suffix itself (a period shorter than ``n``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY = np.empty(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class Draft:
    """``tokens`` (int32, read-only) proposed after a match of ``match_len`` tokens; ``source``
    names where they come from (``"self"``: the request's own tokens; ``"tree"``: the cache)."""

    tokens: np.ndarray
    match_len: int
    source: str

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


NO_DRAFT = Draft(EMPTY, 0, "none")


def suffix_match(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> Draft:
    """The draft of ``tokens`` (a 1-D int array) by its own history, or :data:`NO_DRAFT`."""
    length = int(tokens.shape[0])
    if k < 1 or length < min_n + 1:
        return NO_DRAFT
    # candidate ends j < length - 1 with tokens[j] == tokens[-1]; each match's length at once:
    # the tokens before each end against the suffix's, offset by offset, cut at the first
    # differing one (an end j reaches back j + 1 tokens at most)
    cand = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
    if cand.size == 0:
        return NO_DRAFT
    span = min(max_n, length - 1)
    back = np.arange(span)
    before = cand[:, None] - back  # [candidates, span]
    same = tokens[np.maximum(before, 0)] == tokens[length - 1 - back]
    same &= before >= 0
    lens = np.where(same.all(axis=1), span, same.argmin(axis=1))
    best = int(lens.max())
    if best < min_n:
        return NO_DRAFT
    ends = cand[lens == best]  # ascending
    full = ends[ends + k <= length - 1]  # continuation tokens[j + 1 : j + 1 + k] is whole
    j = int(full[-1]) if full.size else int(ends[0])
    return Draft(tokens[j + 1 : j + 1 + k].astype(np.int32), best, "self")  # a copy
