from __future__ import annotations

import pytest
import torch

from radixserve.memory_pool import (
    KVCache,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
    kv_bytes_per_token,
    num_slots_for_budget,
)


def test_slots_are_unique_and_never_zero() -> None:
    alloc = TokenToKVPoolAllocator(64)
    got = torch.cat([alloc.alloc(n) for n in (5, 20, 38)])
    assert len(torch.unique(got)) == 63
    assert 0 not in got.tolist()
    assert alloc.available_size() == 0
    alloc.check_integrity(held_slots=got)


def test_alloc_returns_none_when_short_and_takes_nothing() -> None:
    alloc = TokenToKVPoolAllocator(16)
    assert alloc.alloc(15) is not None
    before = alloc.available_size()
    assert alloc.alloc(1) is None
    assert alloc.available_size() == before == 0


def test_freed_slots_are_reused() -> None:
    alloc = TokenToKVPoolAllocator(9)
    first = alloc.alloc(8)
    assert first is not None and alloc.alloc(1) is None
    alloc.free(first[:3])
    again = alloc.alloc(3)
    assert again is not None and sorted(again.tolist()) == sorted(first[:3].tolist())
    alloc.check_integrity(held_slots=torch.cat([first[3:], again]))


def test_double_free_and_lost_slots_are_detected() -> None:
    alloc = TokenToKVPoolAllocator(8)
    slots = alloc.alloc(4)
    alloc.free(slots)
    with pytest.raises(AssertionError, match="twice"):
        alloc.free(slots[:1])
    held = alloc.alloc(2)
    with pytest.raises(AssertionError, match="leaked"):
        alloc.check_integrity(held_slots=held[:1])


def test_a_page_listed_twice_in_the_free_list_is_detected() -> None:
    alloc = TokenToKVPoolAllocator(8)
    held = alloc.alloc(3)
    alloc.check_integrity(held_slots=held)
    # what a bug freeing a page past the double-free check would leave behind
    alloc._free_pages = torch.cat([alloc._free_pages, alloc._free_pages[:1]])
    with pytest.raises(AssertionError, match="appears twice"):
        alloc.check_integrity(held_slots=held)


@pytest.mark.parametrize("page_size", [4, 16])
def test_page_aligned_allocation(page_size: int) -> None:
    alloc = TokenToKVPoolAllocator(8 * page_size, page_size)
    assert alloc.capacity == 7 * page_size
    slots = alloc.alloc(2 * page_size)
    assert slots is not None
    assert (slots[::page_size] % page_size == 0).all()  # every page starts on a boundary
    assert (slots.view(2, page_size).diff(dim=1) == 1).all()  # and is contiguous
    with pytest.raises(ValueError, match="whole number of pages"):
        alloc.alloc(page_size + 1)
    alloc.free(slots[:1])  # one slot frees its whole page
    assert alloc.available_size() == 6 * page_size


def test_alloc_extend_fills_the_partial_last_page_first() -> None:
    ps = 4
    alloc = TokenToKVPoolAllocator(16 * ps, ps)
    first = alloc.alloc_extend([0, 0], [6, 3], [0, 0])
    assert first is not None and len(first) == 9
    a, b = first[:6], first[6:]
    # request a: token 6 goes right after token 5 in the same page
    more = alloc.alloc_extend([6, 3], [9, 4], [int(a[-1]), int(b[-1])])
    assert more is not None
    assert more[:2].tolist() == [int(a[-1]) + 1, int(a[-1]) + 2]
    assert int(more[2]) % ps == 0  # token 8 of a opens a new page
    assert int(more[3]) == int(b[-1]) + 1  # token 3 of b fills its page
    for seq in (torch.cat([a, more[:3]]),):
        assert (seq % ps == torch.arange(len(seq)) % ps).all()


def test_alloc_extend_short_allocates_nothing() -> None:
    alloc = TokenToKVPoolAllocator(4 * 4, 4)
    before = alloc.available_size()
    assert alloc.alloc_extend([0], [13], [0]) is None
    assert alloc.available_size() == before


def test_req_to_token_pool_rows() -> None:
    pool = ReqToTokenPool(3, 16)
    rows = pool.alloc(2)
    assert rows is not None and len(set(rows)) == 2
    assert pool.alloc(2) is None
    pool.write(rows[0], 2, torch.tensor([7, 8, 9]))
    assert pool.req_to_token[rows[0], :5].tolist() == [0, 0, 7, 8, 9]
    pool.free(rows)
    assert pool.available_size() == 3
    pool.check_integrity()


def test_kv_cache_set_and_get() -> None:
    cache = KVCache(num_layers=2, num_slots=10, num_kv_heads=2, head_dim=4)
    k = torch.randn(3, 2, 4)
    v = torch.randn(3, 2, 4)
    slots = torch.tensor([1, 5, 9])
    cache.set_kv(1, slots, k, v)
    kb, vb = cache.get_kv(1)
    assert torch.equal(kb[slots], k) and torch.equal(vb[slots], v)
    assert cache.get_kv(0)[0].abs().sum() == 0


def test_pool_sizing_from_a_byte_budget() -> None:
    per_token = kv_bytes_per_token(24, 2, 64, torch.bfloat16)
    assert per_token == 2 * 24 * 2 * 64 * 2
    slots = num_slots_for_budget(100 * per_token + 5, 24, 2, 64, torch.bfloat16, page_size=16)
    assert slots == 96
    with pytest.raises(ValueError):
        num_slots_for_budget(per_token, 24, 2, 64, torch.bfloat16)


def test_claim_takes_pages_off_the_free_list() -> None:
    alloc = TokenToKVPoolAllocator(32, page_size=4)
    held = torch.tensor([8, 9, 10, 11, 20])  # pages 2 and 5
    alloc.claim(held)
    assert alloc.available_size() == alloc.capacity - 8
    alloc.check_integrity(torch.tensor([8, 9, 10, 11, 20, 21, 22, 23]))
    taken = alloc.alloc(alloc.available_size())
    assert taken is not None and not set(taken.tolist()) & (set(range(8, 12)) | set(range(20, 24)))
    with pytest.raises(AssertionError, match="not free"):
        alloc.claim(torch.tensor([8]))
