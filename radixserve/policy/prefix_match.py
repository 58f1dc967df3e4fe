"""Matching a request against the prefix cache: the one place that decides the match key."""

from __future__ import annotations

from radixserve.radix.base import PrefixCache
from radixserve.types import Req


def match_key(req: Req) -> list[int]:
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


def match_req_prefix(req: Req, tree: PrefixCache) -> None:
    """Set ``req.prefix_indices`` (int64 KV slots) and ``req.last_node`` from ``tree``.

    Read-only on the tree apart from access times and node splits (a split keeps every earlier
    match valid: the old node object stays the lower half). Takes no lock: the caller (the
    ``PrefillAdder``) locks ``req.last_node`` when it admits the request. The match is only valid
    until the tree next evicts, so match in the same pass that admits.
    """
    result = tree.match_prefix(match_key(req), req.extra_key)
    req.prefix_indices = result.indices
    req.last_node = result.last_node
