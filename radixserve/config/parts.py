"""The engine's config parts besides admission: the KV tier, LoRA, parallelism, execution (threads,
kernels, CUDA graphs, overlap) and speculative decoding. Each is frozen and checks its own fields
in ``__post_init__`` (a ``ValueError`` naming the field); rules across parts are
``EngineConfig``'s. The field names are the flat names of ``Engine(...)`` and of the CLI's flags."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# the kernel variants (x86 lowest first)
CPU_ISAS = ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "neon")
KV_TIER_WRITE_POLICIES = ("write_back", "write_through")  # SGLang's --hicache-write-policy
# where the overlap loop launches a batch: the worker thread, or the scheduler thread on the
# device's stream (asynchronous on CUDA only; runtime/model_worker.py)
OVERLAP_LAUNCHES = ("thread", "stream")


@dataclass(frozen=True, slots=True)
class KVTierConfig:
    """A second KV tier under the radix tree (docs/kv_tier.md): host memory
    (``enable_hierarchical_cache``, SGLang's name) or a memory-mapped file in ``kv_tier_path``
    that survives a restart; ``kv_tier_bytes`` None: twice the pool's bytes (SGLang's hicache
    ratio 2)."""

    enable_hierarchical_cache: bool = False
    kv_tier_path: str | None = None
    kv_tier_bytes: int | None = None
    kv_tier_write_policy: str = "write_back"

    def __post_init__(self) -> None:
        if self.kv_tier_write_policy not in KV_TIER_WRITE_POLICIES:
            raise ValueError(
                f"kv_tier_write_policy must be one of {KV_TIER_WRITE_POLICIES}, "
                f"got {self.kv_tier_write_policy!r}"
            )
        if self.kv_tier_bytes is not None and self.kv_tier_bytes <= 0:
            raise ValueError(f"kv_tier_bytes must be > 0, got {self.kv_tier_bytes}")

    @property
    def enabled(self) -> bool:
        return self.enable_hierarchical_cache or self.kv_tier_path is not None


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """LoRA adapters (docs/lora.md): (name, directory) served from the start, more loaded at run
    time; at most ``max_loras_per_batch`` distinct ones per batch, ``max_loaded_loras`` in
    memory (None: all), ranks up to ``max_lora_rank``. ``lora_paths`` takes what
    :func:`lora_path_pairs` does and holds its pairs."""

    lora_paths: tuple[tuple[str, str], ...] = ()
    max_loras_per_batch: int = 8
    max_loaded_loras: int | None = None
    max_lora_rank: int = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_paths", lora_path_pairs(self.lora_paths))
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.max_loras_per_batch < 1:
            raise ValueError(f"max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}")
        if self.max_loaded_loras is not None and self.max_loaded_loras < self.max_loras_per_batch:
            raise ValueError("max_loaded_loras must be >= max_loras_per_batch")


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """Tensor parallelism (docs/tensor_parallel.md): ``tp_size`` ranks that each hold a slice of
    the model; rank 0 schedules, the others run the model only; collectives time out after
    ``tp_timeout_s``. Over several machines (SGLang's names): ``nnodes`` machines of
    ``tp_size / nnodes`` ranks each meet at ``dist_init_addr`` (HOST:PORT, node 0's address);
    node 0 serves, the others only run their ranks. ``dp_rank``: set by ``serve --dp-size`` for
    each worker; its KV events carry it."""

    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    tp_timeout_s: float = 120.0
    dp_rank: int = 0

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.tp_timeout_s <= 0:
            raise ValueError(f"tp_timeout_s must be > 0, got {self.tp_timeout_s}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node_rank must be in [0, nnodes), got {self.node_rank} of {self.nnodes}"
            )
        if self.nnodes == 1:
            return
        if self.tp_size % self.nnodes:
            raise ValueError(f"tp_size {self.tp_size} does not divide into {self.nnodes} nodes")
        host, _, port = (self.dist_init_addr or "").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("nnodes > 1 needs dist_init_addr HOST:PORT (node 0's address)")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


@dataclass(frozen=True, slots=True)
class ExecutionConfig:
    """How the model runs: torch threads, the CPU kernels, the attention backend, CUDA graphs
    and the overlap loop. The CPU fields default to their environment variables."""

    num_threads: int | None = field(default_factory=lambda: _env_int("RADIXSERVE_NUM_THREADS"))
    # the highest CPU kernel variant to use (models/kernels/_ext.py); None: the best this CPU
    # runs. "avx2" on an AVX-512 machine runs (and tests) the portable AVX2 path.
    cpu_isa: str | None = field(
        default_factory=lambda: os.environ.get("RADIXSERVE_CPU_ISA") or None
    )
    # the skinny-GEMM kernel for decode-shaped linears and the RMSNorm kernel on CPU
    # (models/kernels/)
    disable_cpu_linear_kernel: bool = field(
        default_factory=lambda: bool(_env_int("RADIXSERVE_DISABLE_CPU_LINEAR_KERNEL"))
    )
    # the flash-style attention kernel on CPU (the cpu_kernel backend; off: torch_native)
    disable_cpu_attention_kernel: bool = field(
        default_factory=lambda: bool(_env_int("RADIXSERVE_DISABLE_CPU_ATTENTION_KERNEL"))
    )
    attention_backend: str | None = None  # None: flashinfer on cuda, torch_native on cpu
    # CUDA only: decode steps of up to cuda_graph_max_bs rows (None: max_running_requests, at
    # most 256) replayed from CUDA graphs captured at start (runtime/cuda_graph.py)
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    # CUDA, with speculative decoding: verify forwards replayed from graphs too (runtime/
    # verify_graph.py), of up to min(cuda_graph_max_bs, 64) requests
    cuda_graph_verify: bool = False
    # CUDA: FlashInfer's decode on tensor cores (True), on CUDA cores (False), or None: CUDA
    # cores for GQA groups of 1, 2, 4 and 8 (FlashInfer builds those), tensor cores for others
    flashinfer_decode_tensor_cores: bool | None = None
    # CUDA: FlashInfer's fused add+RMSNorm and SiLU-and-mul for the torch ops (models/kernels/
    # cuda_kernels.py)
    flashinfer_fused_ops: bool = False
    disable_overlap_schedule: bool = False
    overlap_launch: str = "thread"  # one of OVERLAP_LAUNCHES

    def __post_init__(self) -> None:
        if self.cpu_isa is not None and self.cpu_isa not in CPU_ISAS:
            raise ValueError(f"cpu_isa must be one of {CPU_ISAS} or None, got {self.cpu_isa!r}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ValueError("cuda_graph_max_bs must be >= 1")
        if self.overlap_launch not in OVERLAP_LAUNCHES:
            raise ValueError(
                f"overlap_launch must be one of {OVERLAP_LAUNCHES}, got {self.overlap_launch!r}"
            )


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding from text already seen (docs/speculative.md), SGLang's names:
    ``speculative_algorithm`` "NGRAM" or None (off); ``speculative_num_draft_tokens`` counts the
    tokens a request computes in one verify (its last one and up to num_draft_tokens - 1
    drafts); match windows in tokens; capacity: tokens of the tree's cached sequences indexed;
    max_batch_size: no drafts above; cost_model: "measured" (timed at start) or "prior" (a
    fixed ratio: what is drafted depends on the texts alone)."""

    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 8
    speculative_ngram_min_match_window_size: int = 2
    speculative_ngram_max_match_window_size: int = 12
    speculative_ngram_capacity: int = 1 << 18
    speculative_ngram_max_batch_size: int | None = None
    speculative_cost_model: str = "measured"

    def __post_init__(self) -> None:
        if self.speculative_algorithm not in (None, "NGRAM"):
            raise ValueError(
                f"speculative_algorithm must be NGRAM or None, got {self.speculative_algorithm!r}"
            )
        if self.speculative_cost_model not in ("measured", "prior"):
            raise ValueError(
                "speculative_cost_model must be measured or prior, "
                f"got {self.speculative_cost_model!r}"
            )
        lo, hi = (
            self.speculative_ngram_min_match_window_size,
            self.speculative_ngram_max_match_window_size,
        )
        if self.speculative_num_draft_tokens < 2 or not 1 <= lo <= hi:
            raise ValueError(
                "speculative_num_draft_tokens must be >= 2 and 1 <= min <= max match window"
            )
        bs = self.speculative_ngram_max_batch_size
        if self.speculative_ngram_capacity < 1 or (bs is not None and bs < 1):
            raise ValueError("speculative_ngram_capacity and max_batch_size must be >= 1")


def lora_path_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """``--lora-paths`` as SGLang takes them: ``NAME=DIR`` or ``DIR`` (named by itself)
    strings, a ``{name: dir}`` mapping, or ``(name, dir)`` pairs -> ``(name, dir)`` pairs."""
    items = value.items() if isinstance(value, dict) else value or ()
    pairs = []
    for item in items:
        if isinstance(item, str):
            name, sep, path = item.partition("=")
            item = (name, path) if sep else (item, item)
        name, path = item
        pairs.append((str(name), str(path)))
    return tuple(pairs)
