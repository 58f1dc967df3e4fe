"""The stricter admission check for ``ignore_eos`` requests (SGLang's ``add_one_req_ignore_eos``).

An ``ignore_eos`` request always decodes all of its ``max_new_tokens``, so the usual estimate
(running requests reserve ``new_token_ratio`` of their remaining budget) may be too optimistic.
This check replays the future: every request still to decode is a state ``(tokens_left,
tokens_occupied)``; sorted by ``tokens_left``, the ``bs`` requests alive when the i-th one
finishes each need ``tokens_left_i`` more tokens, and every request that finished before has
given back its ``tokens_occupied``. Admission needs room for that at every step, plus a small
reserve per request.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixserve.types import Req

ReqState = tuple[float, int]  # (tokens_left, tokens_occupied)


def req_state(req: Req, new_token_ratio: float) -> ReqState:
    """``tokens_left``: ``ignore_eos`` requests decode to the end (ratio 1.0); others are expected
    to decode ``new_token_ratio`` of ``max_new_tokens`` in all. ``tokens_occupied``: ``seq_len``."""
    ratio = 1.0 if req.sampling_params.ignore_eos else new_token_ratio
    tokens_left = req.sampling_params.max_new_tokens * ratio - len(req.output_ids)
    return tokens_left, req.seq_len


def ignore_eos_fits(states: Iterable[ReqState], free_tokens: float, reserve_per_req: int) -> bool:
    """True when ``free_tokens`` (free + evictable now, after the new request's input is paid)
    covers every future step of ``states`` with ``reserve_per_req`` tokens to spare per request.
    States with nothing left to decode are ignored."""
    pending = sorted((s for s in states if s[0] > 0), key=lambda s: s[0])
    freed = 0
    for i, (tokens_left, tokens_occupied) in enumerate(pending):
        bs = len(pending) - i
        if free_tokens + freed - tokens_left * bs <= reserve_per_req * bs:
            return False
        freed += tokens_occupied
    return True
