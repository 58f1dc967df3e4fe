"""Builders for policy tests: real RadixCache and TokenToKVPoolAllocator, no model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixserve.config import AdmissionConfig, SchedulerConstants
from radixserve.memory_pool import TokenToKVPoolAllocator
from radixserve.policy import PrefillAdder
from radixserve.radix import NoPrefixCache, RadixCache
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


@dataclass
class PoolView:
    """What admission reads of KV memory (the KVManager's :class:`KVView`), over a bare tree
    and allocator."""

    tree: RadixCache | NoPrefixCache
    allocator: TokenToKVPoolAllocator

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def available_size(self) -> int:
        return self.allocator.available_size() + self.tree.evictable_size()


def new_adder(
    tree: RadixCache | NoPrefixCache,
    alloc: TokenToKVPoolAllocator,
    running: Sequence[Req] = (),
    *,
    ratio: float = 1.0,
    max_prefill: int = 16384,
    chunk: int | None = None,
    max_new_reqs: int = 64,
    constants: SchedulerConstants | None = None,
    priority: bool = False,
    low_first: bool = False,
    interleave: bool = False,
) -> PrefillAdder:
    config = AdmissionConfig(
        max_prefill_tokens=max_prefill,
        chunked_prefill_size=chunk,
        constants=constants or SchedulerConstants(),
        enable_priority_scheduling=priority,
        schedule_low_priority_values_first=low_first,
        enable_prefill_interleaving=interleave,
    )
    return PrefillAdder(config, PoolView(tree, alloc), running, ratio, max_new_reqs)
