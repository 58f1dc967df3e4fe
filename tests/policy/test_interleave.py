"""Prefill interleaving (``policy/interleave.py``): a continuing chunk leaves room for whole short
prompts. The first table is SGLang's own cases for HRRN's default minimum (half the budget)
and an explicit one (``TestShortestPrefillFirst.test_policy_default_minimum_and_explicit_override``
and its neighbours), ported to this function's arguments."""

from __future__ import annotations

import pytest
import torch
from policy_helpers import make_req, new_adder, pool

from radixserve.policy.interleave import SCAN, interleave
from radixserve.types import Req


def waiting(*lengths: int) -> list[Req]:
    return [make_req(range(1000 * i, 1000 * i + n), rid=f"w{i}") for i, n in enumerate(lengths)]


def uncached(req: Req) -> int:
    return req.seq_len


@pytest.mark.parametrize(
    ("continuation", "budget", "waiter", "minimum", "page", "expected"),
    [
        (32768, 16384, 8192, None, 256, 8192),  # half the budget kept, half reserved
        (32768, 4096, 3072, None, 256, None),  # would leave the continuation under half
        (32768, 1280, 512, None, 256, 768),
        (32768, 256, 1, None, 256, None),  # one page is the whole budget
        (32768, 4096, 3840, 256, 256, 256),  # an explicit minimum
        (16384, 4096, 257, None, 256, 3584),  # the waiter rounds up to two pages
        (8192, 4096, 8192, None, 256, None),  # not shorter than the continuation
    ],
)
def test_sglangs_cases(continuation, budget, waiter, minimum, page, expected) -> None:
    limit, _ = interleave(continuation, waiting(waiter), uncached, budget, page, minimum)
    assert limit == expected


def test_fitting_requests_go_first_in_their_order_and_the_rest_keep_theirs() -> None:
    queue = waiting(8192, 257, 3072, 2560)  # SGLang's: large, first-fit, middle, last-fit
    limit, order = interleave(16384, queue, uncached, 4096, 256, 1024)
    assert limit == 4096 - 512 - 2560
    assert [r.rid for r in order] == ["w1", "w3", "w0", "w2"]


def test_only_the_first_scan_requests_are_looked_at() -> None:
    queue = waiting(*([4096] * SCAN + [256]))
    assert interleave(8192, queue, uncached, 4096, 256)[0] is None


def test_a_short_request_runs_beside_the_continuing_chunk() -> None:
    """The adder: without interleaving the continuation takes the whole chunk budget and the
    short request waits; with it the short one is admitted in the same pass."""
    for enabled, admitted_short in ((False, False), (True, True)):
        tree, alloc = pool(4096)
        long_req = make_req(range(2000), max_new=4)
        long_req.prefix_indices, long_req.last_node = torch.arange(1, 257), tree.root
        short = make_req(range(5000, 5100), max_new=4)
        adder = new_adder(tree, alloc, chunk=512, interleave=enabled)
        plan = adder.plan([short], chunked_req=long_req)
        assert (short in plan.reqs) is admitted_short
        assert adder.extend_len(long_req) == (412 if enabled else 512)
        assert plan.chunked is long_req
