from __future__ import annotations

from policy_helpers import cache_tokens, make_req, pool

from radixserve.policy import match_req_prefix
from radixserve.radix import NoPrefixCache


def test_the_last_token_is_never_matched() -> None:
    tree, alloc = pool(64)
    cache_tokens(tree, alloc, range(10))
    req = make_req(range(10))
    m_req = match_req_prefix(req, tree)
    assert len(m_req.indices) == 9
    assert m_req.last_node is not tree.root


def test_output_tokens_are_part_of_the_key() -> None:
    tree, alloc = pool(64)
    cache_tokens(tree, alloc, range(12))
    req = make_req(range(8), output=[8, 9, 10, 11])  # a preempted request with output kept
    m_req = match_req_prefix(req, tree)
    assert len(m_req.indices) == 11


def test_pages_and_extra_keys() -> None:
    tree, alloc = pool(64, page_size=4)
    cache_tokens(tree, alloc, range(8))
    req = make_req(range(8))
    m_req = match_req_prefix(req, tree)
    assert len(m_req.indices) == 4  # 7 matchable tokens, one whole page
    salted = make_req(range(8), extra_key="salt")
    m_salted = match_req_prefix(salted, tree)
    assert len(m_salted.indices) == 0 and m_salted.last_node is tree.root


def test_disabled_cache_matches_nothing() -> None:
    req = make_req(range(10))
    tree = NoPrefixCache()
    m_req = match_req_prefix(req, tree)
    assert len(m_req.indices) == 0 and m_req.last_node is tree.root


def test_prompt_logprobs_limit_the_match() -> None:
    import torch

    from radixserve.policy import match_key, match_req_prefix
    from radixserve.radix import RadixCache
    from radixserve.types import Req

    tree = RadixCache()
    tree.insert(list(range(10)), torch.arange(1, 11))
    req = Req("r", list(range(10)), logprob_start_len=6)
    assert match_key(req).tolist() == list(range(5))
    m_req = match_req_prefix(req, tree)
    assert len(m_req.indices) == 5
    resumed = Req("r", list(range(10)), logprob_start_len=6, output_ids=[3])
    assert len(match_key(resumed)) == 10  # a resumed request had its prompt logprobs already
