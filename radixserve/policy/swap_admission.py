"""Whether a swapped-out request can come back now: vLLM V0's OK / LATER / NEVER (its
``BlockSpaceManager.can_swap_in``, ``vllm/core/block_manager.py``).

A request preempted or retracted in swap mode (``preemption_mode="swap"``) waits with its KV in
the tier. When it is offered again, it needs pool slots for that KV (the load-back), for what it
still computes and for its reserved decoding. vLLM answers ``can_swap_in`` against a watermark
of free blocks kept back so that running requests are not starved at once: NEVER when the pool
could not hold it even empty, LATER when it would dig into the watermark now, OK otherwise.
"""

from __future__ import annotations

import enum

WATERMARK = 0.01  # of the pool's capacity (vLLM's default watermark)


class AllocStatus(enum.Enum):
    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


def watermark_tokens(capacity: int) -> int:
    return int(capacity * WATERMARK)


def can_swap_in(need: float, available: float, capacity: int) -> AllocStatus:
    """``need``: the slots the request takes (loaded back, computed, reserved); ``available``:
    what this pass can still give (free, evictable, minus what it admitted and reserved)."""
    watermark = watermark_tokens(capacity)
    if need > capacity - watermark:
        return AllocStatus.NEVER
    if available - need < watermark:
        return AllocStatus.LATER
    return AllocStatus.OK
