"""Matching a request against the prefix cache: the one place that decides the match key."""

from __future__ import annotations

from radixserve.radix.base import PrefixCache
from radixserve.types import Req


def match_key(req: Req) -> list[int]:
    """The tokens a request may take from the cache: all of ``fill_ids`` but the last.

    The last token is always computed, because its logits give the next token.
    """
    fill_ids = req.fill_ids
    return fill_ids[: len(fill_ids) - 1]


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
