"""``EngineConfig``: what a user chooses when starting an Engine or a server, as small frozen
parts that each check their own fields, and the rules across parts.

Users pass flat names, as SGLang's ``Engine(**server_args)`` takes them:
``EngineConfig.from_flat(tp_size=2, max_lora_rank=16)`` routes each name to the part whose field
it is (a part's field names are the flat names), and ``config.replace(...)`` does the same for a
changed copy. ``config.flat()`` is the inverse: every field by its flat name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from radixserve.config.admission import AdmissionConfig
from radixserve.config.parts import (
    ExecutionConfig,
    KVTierConfig,
    LoRAConfig,
    ParallelConfig,
    SpeculativeConfig,
)
from radixserve.kv_events_config import KVEventsConfig

QUANTIZATIONS = ("int8",)
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The model, the KV pool and the prefix cache, and the parts: ``admission`` (scheduling),
    ``kv_tier``, ``lora``, ``parallel``, ``execution`` (threads, kernels, CUDA graphs, overlap)
    and ``speculative``. Each part checks its own fields; ``__post_init__`` checks the rules
    that join parts, one named check each."""

    model_path: str | None = None
    dtype: str = "auto"  # one of DTYPES
    quantization: str | None = None  # None | int8 (weight-only, per output channel)
    device: str = "cpu"
    page_size: int = 1
    max_total_tokens: int | None = None  # KV slots; None: from kv_cache_bytes
    kv_cache_bytes: int = 1 << 30
    max_context_len: int | None = None  # None: the model's max_position_embeddings
    disable_radix_cache: bool = False
    # structured output: emit a grammar's forced text in one extend step (docs/structured_output.md)
    disable_jump_forward: bool = False
    random_seed: int = 0
    # SGLang's --kv-events-config, parsed (its JSON text is accepted here and parsed once):
    # publish the radix tree's changes (radix/kv_events.py); None: not given
    kv_events_config: KVEventsConfig | None = None
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    kv_tier: KVTierConfig = field(default_factory=KVTierConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def __post_init__(self) -> None:
        if isinstance(self.kv_events_config, str):
            parsed = KVEventsConfig.from_cli(self.kv_events_config)  # a ValueError naming the field
            object.__setattr__(self, "kv_events_config", parsed)
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS} or None, got {self.quantization!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        self._check_chunk_fits_page()
        self._check_swap_has_tier()
        self._check_tier_keeps_prefixes()
        self._check_tier_on_one_rank()

    def _check_chunk_fits_page(self) -> None:
        chunk = self.admission.chunk_size
        if chunk is not None and chunk < self.page_size:
            raise ValueError(f"chunked_prefill_size {chunk} < page_size {self.page_size}")

    def _check_swap_has_tier(self) -> None:
        if self.admission.preemption_mode == "swap" and not self.kv_tier.enabled:
            raise ValueError(
                "preemption_mode='swap' needs a KV tier (--kv-tier-path or "
                "--enable-hierarchical-cache)"
            )

    def _check_tier_keeps_prefixes(self) -> None:
        if self.kv_tier.enabled and self.disable_radix_cache:
            raise ValueError("a KV tier keeps the radix cache's prefixes: it needs the cache on")

    def _check_tier_on_one_rank(self) -> None:
        if self.kv_tier.enabled and self.parallel.tp_size > 1:
            raise ValueError("a KV tier with tensor parallelism is not supported yet")

    @property
    def kv_events(self) -> KVEventsConfig | None:
        """The KV event publisher's config, or None when publishing is off."""
        config = self.kv_events_config
        return config if config is not None and config.enabled else None

    @classmethod
    def from_flat(cls, **flat: Any) -> EngineConfig:
        """The config of flat names (``max_lora_rank=16``: ``lora.max_lora_rank``); a part may
        be given whole too (``lora=LoRAConfig(...)``), flat names of it then change it.
        ``TypeError`` naming a name that is no field; ``ValueError`` for a bad value."""
        top, parts = _route(flat)
        for name, changes in parts.items():
            part = top.get(name)
            top[name] = (
                PARTS[name](**changes) if part is None else dataclasses.replace(part, **changes)
            )
        return cls(**top)

    def replace(self, **flat: Any) -> EngineConfig:
        """A copy with the fields of flat names (or whole parts) changed, checked again."""
        top, parts = _route(flat)
        for name, changes in parts.items():
            top[name] = dataclasses.replace(top.get(name, getattr(self, name)), **changes)
        return dataclasses.replace(self, **top)

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name, the parts' fields in place of the parts:
        ``EngineConfig.from_flat(**config.flat()) == config``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in PARTS:
                out.update((g.name, getattr(value, g.name)) for g in dataclasses.fields(value))
            else:
                out[f.name] = value
        return out


PARTS: dict[str, Any] = {
    "admission": AdmissionConfig,
    "kv_tier": KVTierConfig,
    "lora": LoRAConfig,
    "parallel": ParallelConfig,
    "execution": ExecutionConfig,
    "speculative": SpeculativeConfig,
}
# flat name -> the part that holds it; a name is a field of one part and never a top-level field
PART_OF: dict[str, str] = {
    f.name: part for part, kind in PARTS.items() for f in dataclasses.fields(kind)
}
_TOP_LEVEL = frozenset(f.name for f in dataclasses.fields(EngineConfig))
assert len(PART_OF) == sum(len(dataclasses.fields(k)) for k in PARTS.values()), "a name twice"
assert not _TOP_LEVEL & PART_OF.keys(), "a part's field named as a top-level field"


def _route(flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``flat`` split into top-level fields and each part's changes."""
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        if name in _TOP_LEVEL:
            top[name] = value
        elif name in PART_OF:
            parts.setdefault(PART_OF[name], {})[name] = value
        else:
            raise TypeError(f"EngineConfig has no field {name!r}")
    return top, parts
