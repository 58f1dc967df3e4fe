"""Matching a request against the prefix cache: the one place that decides the match key."""

from __future__ import annotations

import numpy as np

from radixserve.radix.base import MatchResult, PrefixCache
from radixserve.types import Req


def match_key(req: Req) -> np.ndarray:
    """The tokens a request may take from the cache: all of ``fill_ids`` but the last.

    The last token is always computed, because its logits give the next token. A request that
    asks for prompt logprobs from ``logprob_start_len`` on matches only up to the token before.
    """
    fill_ids = req.fill_ids
    end = len(fill_ids) - 1
    if req.logprob_start_len >= 0 and not req.output_ids:
        # prompt logprobs from position p on need the logits of position p - 1 computed
        end = min(end, max(req.logprob_start_len - 1, 0))
    return fill_ids[:end]


def match_req_prefix(req: Req, tree: PrefixCache) -> MatchResult:
    """The longest cached prefix of ``req`` (``indices``: int64 KV slots; ``last_node``).

    Read-only on the tree apart from access times and node splits (a split keeps every earlier
    match valid: the old node object stays the lower half), and writes nothing to ``req``: the
    match is data of this scheduling pass. It takes no lock: the ``PrefillAdder`` locks
    ``last_node`` when it admits the request, and the ``KVManager`` adopts the match when it
    commits the plan. The match is only valid until the tree next evicts.
    """
    return tree.match_prefix(match_key(req), req.extra_key)
