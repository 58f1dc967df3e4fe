from __future__ import annotations

from policy_helpers import cache_tokens, make_req, pool

from radixserve.policy import match_req_prefix
from radixserve.radix import NoPrefixCache


def test_the_last_token_is_never_matched() -> None:
    tree, alloc = pool(64)
    cache_tokens(tree, alloc, range(10))
    req = make_req(range(10))
    match_req_prefix(req, tree)
    assert req.prefix_len == 9
    assert req.last_node is not tree.root


def test_output_tokens_are_part_of_the_key() -> None:
    tree, alloc = pool(64)
    cache_tokens(tree, alloc, range(12))
    req = make_req(range(8), output=[8, 9, 10, 11])  # a preempted request with output kept
    match_req_prefix(req, tree)
    assert req.prefix_len == 11


def test_pages_and_extra_keys() -> None:
    tree, alloc = pool(64, page_size=4)
    cache_tokens(tree, alloc, range(8))
    req = make_req(range(8))
    match_req_prefix(req, tree)
    assert req.prefix_len == 4  # 7 matchable tokens, one whole page
    salted = make_req(range(8), extra_key="salt")
    match_req_prefix(salted, tree)
    assert salted.prefix_len == 0 and salted.last_node is tree.root


def test_disabled_cache_matches_nothing() -> None:
    req = make_req(range(10))
    tree = NoPrefixCache()
    match_req_prefix(req, tree)
    assert req.prefix_len == 0 and req.last_node is tree.root


def test_prompt_logprobs_limit_the_match() -> None:
    import torch

    from radixserve.policy import match_key, match_req_prefix
    from radixserve.radix import RadixCache
    from radixserve.types import Req

    tree = RadixCache()
    tree.insert(list(range(10)), torch.arange(1, 11))
    req = Req("r", list(range(10)), logprob_start_len=6)
    assert match_key(req) == list(range(5))
    match_req_prefix(req, tree)
    assert req.prefix_len == 5
    req.output_ids = [3]  # a resumed request had its prompt logprobs already
    assert len(match_key(req)) == 10
