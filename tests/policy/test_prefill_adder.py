from __future__ import annotations

import pytest
import torch
from policy_helpers import cache_tokens, make_req, new_adder, pool, running_req

from radixserve.config import SchedulerConstants
from radixserve.memory_pool import TokenToKVPoolAllocator
from radixserve.policy import AddReqResult, PrefillAdder, match_req_prefix
from radixserve.radix import NoPrefixCache
from radixserve.types import FinishKind, FinishReason, Req

CONTINUE, NO_TOKEN, OTHER = AddReqResult.CONTINUE, AddReqResult.NO_TOKEN, AddReqResult.OTHER


def offer(adder: PrefillAdder, req: Req, has_chunked_req: bool = False) -> AddReqResult:
    return adder.add_one_req(req, has_chunked_req, match_req_prefix(req, adder.tree_cache))


def test_rem_total_tokens_reserves_for_running_requests() -> None:
    tree, alloc = pool(10_000)
    cache_tokens(tree, alloc, range(100))
    r1 = running_req(alloc, 10, 20, max_new=100)  # 80 left
    r2 = running_req(alloc, 10, 0, max_new=10_000, first_token=60_000)  # clipped to 4096
    done = running_req(alloc, 10, 5, max_new=100, first_token=70_000)
    done.finish_reason = FinishReason(FinishKind.LENGTH)  # finished: reserves nothing
    available = 10_000 - 100 - 29 - 9 - 14
    assert alloc.available_size() == available
    adder = new_adder(tree, alloc, [r1, r2, done], ratio=0.5)
    assert adder.rem_total_tokens == available + 100 - (80 + 4096) * 0.5
    clipped = new_adder(
        tree, alloc, [r1, r2], ratio=0.5, constants=SchedulerConstants(clip_max_new_tokens=1000)
    )
    assert clipped.rem_total_tokens == available + 100 - (80 + 1000) * 0.5


def test_no_token_when_input_plus_output_reaches_the_budget() -> None:
    tree, alloc = pool(100)
    adder = new_adder(tree, alloc)
    assert offer(adder, make_req(range(50), max_new=50)) is NO_TOKEN  # 100 >= 100
    fits = make_req(range(50), max_new=49)
    assert offer(adder, fits) is CONTINUE
    assert adder.can_run_list == [fits] and adder.extend_len(fits) == 50
    assert adder.rem_total_tokens == 1
    assert offer(adder, make_req(range(200, 201), max_new=0)) is NO_TOKEN


def test_other_when_the_prefill_budget_is_spent() -> None:
    tree, alloc = pool(10_000)
    adder = new_adder(tree, alloc, max_prefill=100)
    assert offer(adder, make_req(range(60))) is CONTINUE
    assert offer(adder, make_req(range(100, 140))) is OTHER  # 40 >= 40 left
    assert offer(adder, make_req(range(200, 239))) is CONTINUE
    assert adder.budget.rem_input_tokens == 1
    first_is_allowed_to_exceed = new_adder(tree, alloc, max_prefill=100)
    assert offer(first_is_allowed_to_exceed, make_req(range(150))) is OTHER
    assert len(first_is_allowed_to_exceed.can_run_list) == 1


def test_max_new_reqs() -> None:
    tree, alloc = pool(10_000)
    adder = new_adder(tree, alloc, max_new_reqs=2)
    assert offer(adder, make_req(range(10))) is CONTINUE
    assert offer(adder, make_req(range(20, 30))) is OTHER  # admitted; no slot left
    assert offer(adder, make_req(range(40, 50))) is OTHER
    assert len(adder.can_run_list) == 2


@pytest.mark.parametrize(("page_size", "chunk_len"), [(1, 10), (4, 8)])
def test_a_long_request_becomes_the_single_chunked_request(page_size: int, chunk_len: int) -> None:
    tree, alloc = pool(1024, page_size)
    adder = new_adder(tree, alloc, chunk=10)
    long_req = make_req(range(30))
    result = offer(adder, long_req)
    assert adder.new_chunked_req is long_req
    assert adder.extend_len(long_req) == chunk_len and chunk_len % page_size == 0
    assert adder.budget.rem_chunk_tokens == 10 - chunk_len
    assert result is (OTHER if page_size == 1 else CONTINUE)
    assert offer(adder, make_req(range(100, 101))) is OTHER  # 1 token is a page of 4 > 2 left
    assert adder.can_run_list == [long_req]


def test_chunking_needs_a_whole_page_and_no_other_chunked_request() -> None:
    tree, alloc = pool(1024, 4)
    adder = new_adder(tree, alloc, chunk=10)
    small = make_req(range(7))  # two pages: 8 tokens of the chunk budget
    assert offer(adder, small) is CONTINUE
    assert offer(adder, make_req(range(100, 130))) is OTHER  # 2 tokens left: less than a page
    assert adder.new_chunked_req is None
    other = new_adder(tree, alloc, chunk=10)
    assert offer(other, make_req(range(100, 130)), has_chunked_req=True) is OTHER
    assert other.can_run_list == []


def test_a_small_request_before_a_long_one_leaves_it_a_shorter_chunk() -> None:
    tree, alloc = pool(1024, 4)
    adder = new_adder(tree, alloc, chunk=10)
    assert offer(adder, make_req(range(3))) is CONTINUE  # one page
    long_req = make_req(range(100, 130))
    offer(adder, long_req)
    assert adder.extend_len(long_req) == 4  # 6 tokens of budget left: one whole page


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_continuing_chunked_request_goes_first(page_size: int) -> None:
    tree, alloc = pool(1024, page_size)
    req = make_req(range(30), max_new=5)
    req.prefix_indices, req.last_node = torch.arange(1, 9), tree.root  # first chunk done: 8 tokens
    adder = new_adder(tree, alloc, chunk=8)
    assert adder.add_chunked_req(req) is req
    assert adder.extend_len(req) == 8 and adder.new_chunked_req is req
    assert adder.rem_total_tokens == 1024 - 8  # no decode tokens budgeted for a middle chunk
    assert offer(adder, make_req(range(100, 102))) is OTHER

    req.prefix_indices = torch.arange(1, 25)  # 24 done; 6 left
    last = new_adder(tree, alloc, chunk=8)
    assert last.add_chunked_req(req) is None
    assert last.extend_len(req) == 6 and last.new_chunked_req is None
    assert last.rem_total_tokens == 1024 - last.budget.ceil_pages(6) - 5


def test_the_chunked_request_progresses_even_without_memory() -> None:
    tree, alloc = pool(64)
    hog = running_req(alloc, 40, 1, max_new=1000)  # reserves far more than what is left
    req = make_req(range(30))
    req.prefix_indices, req.last_node = torch.arange(1, 5), tree.root
    adder = new_adder(tree, alloc, [hog], chunk=8)
    assert adder.rem_total_tokens <= 0
    assert adder.add_chunked_req(req) is req and adder.extend_len(req) == 8


def test_lock_then_recheck_rejects_a_request_whose_own_lock_makes_it_not_fit() -> None:
    tree, alloc = pool(200)
    prefix = list(range(100))
    cache_tokens(tree, alloc, prefix)
    assert (alloc.available_size(), tree.evictable_size()) == (100, 100)
    adder = new_adder(tree, alloc)
    too_big = make_req(prefix + list(range(500, 520)), max_new=150)  # 170 < 200, but >= 100
    assert offer(adder, too_big) is NO_TOKEN
    match = adder.match_of(too_big)
    assert len(match.indices) == 100 and match.last_node.lock_ref == 0
    assert tree.evictable_size() == 100 and adder.can_run_list == []
    tree.check_integrity()

    fits = make_req(prefix + list(range(600, 620)), max_new=70)  # 90 < 100 under the lock
    assert offer(adder, fits) is CONTINUE
    node = adder.match_of(fits).last_node
    assert adder.extend_len(fits) == 20 and node.lock_ref == 1  # kept for the scheduler (plan)
    assert tree.evictable_size() == 0 and adder.rem_total_tokens == 10
    tree.dec_lock_ref(node)
    tree.check_integrity()


@pytest.mark.parametrize(
    ("running_ignores_eos", "new_ignores_eos", "admitted"),
    [(True, True, False), (False, True, True), (True, False, True)],
)
def test_ignore_eos_admission(
    running_ignores_eos: bool, new_ignores_eos: bool, admitted: bool
) -> None:
    """SGLang's ignore_eos admission: with ratio 0.5 the usual check passes
    (110 < 200 - 10 - 99 * 0.5); an ignore_eos request next to an ignore_eos runner needs
    2 * 100 tokens more than the 180 free."""
    tree, alloc = pool(200)
    runner = running_req(alloc, 10, 1, max_new=100)
    runner.sampling_params.ignore_eos = running_ignores_eos
    adder = new_adder(tree, alloc, [runner], ratio=0.5)
    req = make_req(range(10), max_new=100, ignore_eos=new_ignores_eos)
    result = offer(adder, req)
    assert (req in adder.can_run_list) is admitted
    assert result is (CONTINUE if admitted else NO_TOKEN)


def test_works_without_a_tree() -> None:
    tree, alloc = NoPrefixCache(), TokenToKVPoolAllocator(101)
    adder = new_adder(tree, alloc)
    req = make_req(range(20), max_new=10)
    assert offer(adder, req) is CONTINUE and adder.extend_len(req) == 20
    assert adder.rem_total_tokens == 100 - 30
