"""SchedulerStats: counters the scheduler keeps for /get_server_info, /metrics and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.policy import Admission
    from radixserve.runtime.kv_manager import KVManager
    from radixserve.runtime.schedule_batch import ScheduleBatch


@dataclass
class SchedulerStats:
    num_prefill_batches: int = 0
    num_decode_batches: int = 0
    num_prefill_tokens: int = 0  # prompt tokens computed (cache misses)
    num_cached_tokens: int = 0  # prompt tokens served from the cache at admission
    num_cached_tokens_tier: int = 0  # the part of those loaded back from the KV tier
    num_swapped_out_tokens: int = 0  # KV moved to the tier by swap preemption
    num_generated_tokens: int = 0
    num_finished_reqs: int = 0
    num_aborted_reqs: int = 0
    num_failed_reqs: int = 0  # ended by an exception of their own (grammar, stop check, ...)
    num_retractions: int = 0
    num_preemptions: int = 0
    num_jump_batches: int = 0  # extend steps of tokens a grammar forced (jump-forward)
    num_mixed_batches: int = 0  # prefill steps that carried the running requests' next tokens
    num_overlapped_batches: int = 0  # launched while the batch before was still in flight
    num_jumped_tokens: int = 0
    # speculative decoding (vLLM's counters): verify steps, requests' drafts verified, their
    # tokens, those accepted, and accepted by draft position
    num_spec_verify_batches: int = 0
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic  # the scheduler's clock
    started_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.clock()

    def on_prefill(self, batch: ScheduleBatch, new: Sequence[Admission]) -> None:
        """``new``: the newly admitted requests, whose cache hits count (a chunked request's
        later chunks reuse its own KV and count as neither hit nor miss)."""
        self.num_prefill_batches += 1
        fb = batch.forward_batch
        assert fb is not None
        carried = 0 if batch.running_from is None else len(batch.reqs) - batch.running_from
        self.num_mixed_batches += carried > 0
        self.num_prefill_tokens += fb.num_tokens - carried
        self.num_cached_tokens += sum(a.prefix_len for a in new)
        self.num_cached_tokens_tier += sum(a.load_len for a in new)

    def on_result(self, batch: ScheduleBatch) -> None:
        if batch.is_decode:
            self.num_decode_batches += 1
        self.num_generated_tokens += sum(batch.samples)

    def on_verified(self, drafted: int, accepted: int) -> None:
        """One request's draft of ``drafted`` tokens, ``accepted`` of them kept."""
        self.num_spec_drafts += 1
        self.num_spec_draft_tokens += drafted
        self.num_spec_accepted_tokens += accepted
        per = self.spec_accepted_per_position
        per.extend([0] * (drafted - len(per)))
        for j in range(accepted):
            per[j] += 1

    @property
    def avg_spec_accept_length(self) -> float:
        """Tokens a request got per verify step it drafted in (SGLang's accept length: its
        accepted drafts plus the model's own token); 0 before any."""
        n = self.num_spec_drafts
        return (n + self.num_spec_accepted_tokens) / n if n else 0.0

    @property
    def cache_hit_rate(self) -> float:
        total = self.num_prefill_tokens + self.num_cached_tokens
        return self.num_cached_tokens / total if total else 0.0

    def snapshot(
        self, kv: KVManager, num_running: int, num_waiting: int, new_token_ratio: float
    ) -> dict[str, Any]:
        """The figures of ``/get_server_info``: these counters, ``kv``'s memory, and what the
        scheduler reports of its queues (a chunked request counts as running)."""
        capacity = kv.allocator.capacity
        free = kv.allocator.available_size()
        cached = kv.tree.total_size()
        return {
            "num_running_reqs": num_running,
            "num_waiting_reqs": num_waiting,
            "max_total_tokens": capacity,
            "num_free_tokens": free,
            "num_cached_tokens_in_tree": cached,
            "num_evictable_tokens": kv.tree.evictable_size(),
            "token_usage": (capacity - free - kv.tree.evictable_size()) / capacity,
            "cache_hit_rate": self.cache_hit_rate,
            "num_prefill_tokens": self.num_prefill_tokens,
            "num_cached_prompt_tokens": self.num_cached_tokens,
            "num_cached_prompt_tokens_tier": self.num_cached_tokens_tier,
            **_tier_snapshot(kv.tiered, self.num_swapped_out_tokens),
            "num_generated_tokens": self.num_generated_tokens,
            "num_finished_reqs": self.num_finished_reqs,
            "num_aborted_reqs": self.num_aborted_reqs,
            "num_failed_reqs": self.num_failed_reqs,
            "num_retractions": self.num_retractions,
            "num_preemptions": self.num_preemptions,
            "num_prefill_batches": self.num_prefill_batches,
            "num_decode_batches": self.num_decode_batches,
            "num_jump_batches": self.num_jump_batches,
            "num_mixed_batches": self.num_mixed_batches,
            "num_overlapped_batches": self.num_overlapped_batches,
            "num_jumped_tokens": self.num_jumped_tokens,
            "num_spec_verify_batches": self.num_spec_verify_batches,
            "num_spec_drafts": self.num_spec_drafts,
            "num_spec_draft_tokens": self.num_spec_draft_tokens,
            "num_spec_accepted_tokens": self.num_spec_accepted_tokens,
            "spec_accepted_per_position": list(self.spec_accepted_per_position),
            "avg_spec_accept_length": self.avg_spec_accept_length,
            "new_token_ratio": new_token_ratio,
            "uptime_s": self.clock() - self.started_at,
        }


def _tier_snapshot(tree: Any, swapped_out: int) -> dict[str, Any]:
    """The KV tier's figures (a ``TieredRadixCache``), or none without a tier."""
    if tree is None:
        return {}
    return {
        "kv_tier": tree.tier.name,
        "kv_tier_capacity_tokens": tree.tier.capacity,
        "kv_tier_used_tokens": tree.tier_size(),
        "kv_tier_written_tokens": tree.num_written_tokens,
        "kv_tier_loaded_tokens": tree.num_loaded_tokens,
        "kv_tier_corrupt_pages": getattr(tree.tier, "num_corrupt_pages", 0),
        "num_swapped_out_tokens": swapped_out,
    }
