"""SchedulerStats: counters the scheduler keeps for /get_server_info, /metrics and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.runtime.schedule_batch import ScheduleBatch
    from radixserve.runtime.scheduler import Scheduler


@dataclass
class SchedulerStats:
    num_prefill_batches: int = 0
    num_decode_batches: int = 0
    num_prefill_tokens: int = 0  # prompt tokens computed (cache misses)
    num_cached_tokens: int = 0  # prompt tokens served from the cache at admission
    num_generated_tokens: int = 0
    num_finished_reqs: int = 0
    num_aborted_reqs: int = 0
    num_retractions: int = 0
    num_preemptions: int = 0
    num_jump_batches: int = 0  # extend steps of tokens a grammar forced (jump-forward)
    num_jumped_tokens: int = 0
    clock: Callable[[], float] = time.monotonic  # the scheduler's clock
    started_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.clock()

    def on_prefill(self, batch: ScheduleBatch, num_cached_tokens: int) -> None:
        """``num_cached_tokens``: the cache hits of the newly admitted requests (a chunked
        request's later chunks reuse its own KV and count as neither hit nor miss)."""
        self.num_prefill_batches += 1
        fb = batch.forward_batch
        assert fb is not None
        self.num_prefill_tokens += fb.num_tokens
        self.num_cached_tokens += num_cached_tokens

    def on_result(self, batch: ScheduleBatch) -> None:
        if batch.is_decode:
            self.num_decode_batches += 1
        self.num_generated_tokens += sum(batch.samples)

    @property
    def cache_hit_rate(self) -> float:
        total = self.num_prefill_tokens + self.num_cached_tokens
        return self.num_cached_tokens / total if total else 0.0

    def snapshot(self, scheduler: Scheduler) -> dict[str, Any]:
        kv = scheduler.kv
        capacity = kv.allocator.capacity
        free = kv.allocator.available_size()
        cached = kv.tree.total_size()
        return {
            "num_running_reqs": len(scheduler.running) + (scheduler.chunked_req is not None),
            "num_waiting_reqs": len(scheduler.waiting),
            "max_total_tokens": capacity,
            "num_free_tokens": free,
            "num_cached_tokens_in_tree": cached,
            "num_evictable_tokens": kv.tree.evictable_size(),
            "token_usage": (capacity - free - kv.tree.evictable_size()) / capacity,
            "cache_hit_rate": self.cache_hit_rate,
            "num_prefill_tokens": self.num_prefill_tokens,
            "num_cached_prompt_tokens": self.num_cached_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "num_finished_reqs": self.num_finished_reqs,
            "num_aborted_reqs": self.num_aborted_reqs,
            "num_retractions": self.num_retractions,
            "num_preemptions": self.num_preemptions,
            "num_prefill_batches": self.num_prefill_batches,
            "num_decode_batches": self.num_decode_batches,
            "num_jump_batches": self.num_jump_batches,
            "num_jumped_tokens": self.num_jumped_tokens,
            "new_token_ratio": scheduler.new_token_ratio,
            "uptime_s": self.clock() - self.started_at,
        }
