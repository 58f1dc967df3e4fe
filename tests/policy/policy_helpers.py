"""Builders for policy tests: real RadixCache and TokenToKVPoolAllocator, no model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from radixserve.memory_pool import TokenToKVPoolAllocator
from radixserve.radix import RadixCache
from radixserve.types import Req, SamplingParams

_rids = itertools.count()


def make_req(
    tokens: Sequence[int],
    *,
    max_new: int = 16,
    output: Sequence[int] = (),
    priority: int = 0,
    arrival: float = 0.0,
    ignore_eos: bool = False,
    extra_key: str | None = None,
    rid: str | None = None,
) -> Req:
    return Req(
        rid=rid if rid is not None else f"r{next(_rids)}",
        origin_input_ids=list(tokens),
        sampling_params=SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos),
        priority=priority,
        arrival_time=arrival,
        extra_key=extra_key,
        output_ids=list(output),
    )


def cache_tokens(
    tree: RadixCache,
    allocator: TokenToKVPoolAllocator,
    tokens: Sequence[int],
    extra_key: str | None = None,
) -> None:
    """Put ``tokens`` (whole pages) into the tree with fresh KV slots, as a finished request
    would; slots for an already-cached part are freed, as the scheduler does."""
    assert len(tokens) % allocator.page_size == 0
    slots = allocator.alloc(len(tokens))
    assert slots is not None
    present = tree.insert(list(tokens), slots, extra_key).num_present
    if present:
        allocator.free(slots[:present])


def running_req(
    allocator: TokenToKVPoolAllocator,
    prompt_len: int,
    output_len: int,
    *,
    max_new: int,
    priority: int = 0,
    arrival: float = 0.0,
    first_token: int = 50_000,
) -> Req:
    """A decoding request that holds ``seq_len - 1`` KV slots of its own (no cache hit), in
    whole pages."""
    tokens = range(first_token, first_token + prompt_len)
    req = make_req(
        tokens, max_new=max_new, output=[7] * output_len, priority=priority, arrival=arrival
    )
    ps = allocator.page_size
    held = allocator.alloc(-(-(req.seq_len - 1) // ps) * ps)  # whole pages
    assert held is not None
    req.prefix_indices = torch.empty(0, dtype=torch.int64)
    req.kv_len = req.seq_len - 1
    return req


def pool(capacity: int, page_size: int = 1) -> tuple[RadixCache, TokenToKVPoolAllocator]:
    """A tree and an allocator with ``capacity`` usable slots."""
    return RadixCache(page_size), TokenToKVPoolAllocator(capacity + page_size, page_size)
