"""NgramDrafter: drafts for a request from text already seen, and how long they should be.

Two sources, never a second model: the request's own prompt and output (prompt lookup,
``suffix_match``) and the sequences the radix tree caches in the request's namespace
(``TreeDraftIndex``: a request sent again finds its cached answer, a later turn the earlier
ones). The longer match wins; on a tie, the longer continuation, then the request's own.

:class:`DraftLength` adapts one request's draft length to what the model accepted lately:
after a draft accepted whole the limit grows, after a rejection it falls to what was accepted
plus one; ``accept_rate`` (per drafted token, a moving average) gives the cost model the
expected gain of each draft position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixserve.spec.suffix_match import NO_DRAFT, Draft, suffix_match
from radixserve.spec.tree_index import TreeDraftIndex

PRIOR_ACCEPT_RATE = 0.6  # a new request's guess, until its first verify (or its match's, if higher)
LONG_MATCH = 8  # a match this long, before a request's first verify, is trusted beyond the prior
EMA_WEIGHT = 0.3  # the weight of the latest verify in ``accept_rate``


@dataclass(frozen=True, slots=True)
class NgramParams:
    """``min_n``/``max_n``: the match window (SGLang's ``speculative_ngram_min/max_match_
    window_size``); ``max_draft``: drafted tokens per request and step at most; ``capacity``:
    tokens of cached sequences indexed (``speculative_ngram_capacity``)."""

    min_n: int = 2
    max_n: int = 12
    max_draft: int = 7
    capacity: int = 1 << 18

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError("the match window needs 1 <= min <= max")
        if self.max_draft < 1 or self.capacity < 1:
            raise ValueError("max_draft and capacity must be >= 1")


class DraftLength:
    """One request's draft-length state (kept on its ``Req.spec_state``)."""

    __slots__ = ("limit", "max_draft", "accept_rate", "observed")

    def __init__(self, max_draft: int) -> None:
        self.max_draft = max_draft
        self.limit = max_draft
        self.accept_rate = PRIOR_ACCEPT_RATE
        self.observed = False  # a verify has judged one of its drafts

    def want(self, match_len: int) -> int:
        """Tokens worth drafting after a match of ``match_len`` (a short match is trusted less)."""
        return min(self.limit, max(2 * match_len, 1))

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.observed = True
        rejected = accepted < drafted
        rate = accepted / (accepted + rejected)
        self.accept_rate += EMA_WEIGHT * (rate - self.accept_rate)
        self.limit = min(self.max_draft, 2 * self.limit) if not rejected else max(accepted + 1, 1)

    def gains(self, n: int, match_len: int = 0) -> list[float]:
        """The expected accepted tokens of draft positions 1..n (each needs all before it).
        Before its first verify a request trusts a long match more than the prior: a draft
        after ``m >= LONG_MATCH`` matching tokens is taken to hold with ``m / (m + 1)`` (ever
        since, its own acceptance, starting from there); a shorter one (a common phrase of
        prose) only with the prior."""
        if not self.observed:
            long = match_len >= LONG_MATCH
            self.accept_rate = match_len / (match_len + 1) if long else PRIOR_ACCEPT_RATE
        return [self.accept_rate ** (j + 1) for j in range(n)]


class NgramDrafter:
    """``index``: the tree's draft index (None: drafts from the request's own tokens only)."""

    def __init__(self, params: NgramParams, index: TreeDraftIndex | None) -> None:
        self.params = params
        self.index = index

    def draft(self, tokens: np.ndarray, namespace: str | None, k: int) -> Draft:
        """Up to ``k`` tokens to follow ``tokens`` (a request's prompt and output)."""
        if k < 1:
            return NO_DRAFT
        p = self.params
        own = suffix_match(tokens, p.min_n, p.max_n, k)
        cached = NO_DRAFT if self.index is None else self.index.propose(tokens, namespace, k)
        if (cached.match_len, len(cached)) > (own.match_len, len(own)):
            return cached
        return own
