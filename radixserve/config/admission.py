"""The scheduling part of the engine's config: what the waiting queue's order, every admission
pass and preemption are built from (``AdmissionConfig``), and SGLang's constants."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

SCHEDULE_POLICIES = ("fcfs", "lof", "random", "lpm", "dfs-weight", "hrrn", "adaptive")
PREEMPTION_MODES = ("recompute", "swap")  # vLLM V0's --preemption-mode


@dataclass(frozen=True, slots=True)
class SchedulerConstants:
    """SGLang's scheduling constants (docs/design.md, "Scheduling"), all overridable."""

    in_batch_prefix_caching_check_threshold: int = 32
    in_batch_prefix_caching_deprioritize_threshold: int = 32
    clip_max_new_tokens: int = 4096
    lpm_fallback_queue_len: int = 128
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098  # 0.7 * 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    priority_preemption_threshold: int = 10
    # Anti-starvation aging of the cache-aware policies (beyond SGLang; policy/schedule_policy.py).
    # By passes (0: off): a request overtaken in this many passes goes first.
    max_skipped_passes: int = 0
    # By admissions (0: off; on by default): a request found waiting behind N
    # others goes first once N times this many requests have been admitted since (FCFS would
    # have admitted it after N)
    aging_work_factor: float = 2.0
    ignore_eos_reserve_tokens: int = 1  # per request, in the ignore_eos admission check

    def without_aging(self) -> SchedulerConstants:
        """These constants with both kinds of aging off (SGLang's LPM and DFS-weight)."""
        return dataclasses.replace(self, max_skipped_passes=0, aging_work_factor=0.0)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """How requests are ordered, admitted and preempted: the scheduler's ``SchedulePolicy`` and
    every admission pass (``policy/prefill_adder.py``) are built from it, besides the pass's
    own state (the running requests, ``new_token_ratio``, the free running slots).

    ``chunked_prefill_size`` None or <= 0: no chunking (:attr:`chunk_size` is None); that it is
    at least one page is the engine's check (the page size is the KV pool's).
    """

    max_running_requests: int = 64
    # SGLang's --max-queued-requests: beyond this many waiting requests a new one is refused
    # (HTTP 429 with Retry-After); None: no bound
    max_queued_requests: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 512  # None or <= 0: no chunking
    # a continuing chunk is cut so whole short prompts queued behind it run in the same step;
    # it keeps at least the min (None: half the chunk budget). SGLang's names (policy/interleave.py).
    # On by default: chosen by measurement (benchmarks/README.md, "Schedule policies")
    enable_prefill_interleaving: bool = True
    prefill_interleaving_min_continuation_tokens: int | None = None
    # chosen by measurement: benchmarks/README.md, "Schedule policies"
    schedule_policy: str = "adaptive"
    enable_priority_scheduling: bool = False
    # SGLang's --enable-mixed-chunk: a prefill step also computes the running requests' next
    # tokens (one each), so they do not wait a step for it (runtime/mixed_chunk.py)
    enable_mixed_chunk: bool = False
    schedule_low_priority_values_first: bool = False  # SGLang default: larger value = more urgent
    # what preemption and retraction do with the victim's KV: cache it and recompute what was
    # evicted (recompute), or move it to the tier, pinned until it resumes (swap; needs a tier)
    preemption_mode: str = "recompute"
    constants: SchedulerConstants = field(default_factory=SchedulerConstants)

    def __post_init__(self) -> None:
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}"
            )
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )

    @property
    def chunk_size(self) -> int | None:
        """The chunk budget of one prefill step per request; None: no chunking."""
        chunk = self.chunked_prefill_size
        return chunk if chunk is not None and chunk > 0 else None
