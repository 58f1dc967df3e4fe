"""AdmissionConfig: the frozen knobs of admission, built once per scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.config import EngineConfig, SchedulerConstants


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """What every admission pass is built from, besides the pass's own state (the running
    requests, ``new_token_ratio`` and the free running slots).

    ``chunked_prefill_size`` None or <= 0: no chunking; otherwise it must be at least one page.
    """

    page_size: int = 1
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None
    constants: SchedulerConstants = field(default_factory=SchedulerConstants)
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    # a continuing chunk leaves room for whole short prompts (policy/interleave.py)
    enable_prefill_interleaving: bool = True
    prefill_interleaving_min_continuation_tokens: int | None = None

    def __post_init__(self) -> None:
        chunk = self.chunked_prefill_size
        if chunk is not None and chunk <= 0:
            object.__setattr__(self, "chunked_prefill_size", None)
        elif chunk is not None and chunk < self.page_size:
            raise ValueError(f"chunked_prefill_size {chunk} < page_size {self.page_size}")

    @classmethod
    def from_engine_config(cls, config: EngineConfig) -> AdmissionConfig:
        return cls(
            page_size=config.page_size,
            max_prefill_tokens=config.max_prefill_tokens,
            chunked_prefill_size=config.chunked_prefill_size,
            constants=config.constants,
            enable_priority_scheduling=config.enable_priority_scheduling,
            schedule_low_priority_values_first=config.schedule_low_priority_values_first,
            enable_prefill_interleaving=config.enable_prefill_interleaving,
            prefill_interleaving_min_continuation_tokens=(
                config.prefill_interleaving_min_continuation_tokens
            ),
        )
