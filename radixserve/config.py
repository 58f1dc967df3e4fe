"""Every knob of radixserve, as frozen dataclasses. The only place that reads the environment."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from radixserve.kv_events_config import KVEventsConfig

SCHEDULE_POLICIES = ("fcfs", "lof", "random", "lpm", "dfs-weight", "hrrn", "adaptive")
QUANTIZATIONS = ("int8",)
CPU_ISAS = ("avx2", "avx512", "avx512_bf16", "neon")  # the kernel variants (x86 lowest first)
KV_TIER_WRITE_POLICIES = ("write_back", "write_through")  # SGLang's --hicache-write-policy
PREEMPTION_MODES = ("recompute", "swap")  # vLLM V0's --preemption-mode
# where the overlap loop launches a batch: the worker thread, or the scheduler thread on the
# device's stream (asynchronous on CUDA only; runtime/model_worker.py)
OVERLAP_LAUNCHES = ("thread", "stream")
REASONING_PARSERS = ("qwen3", "deepseek-r1")  # SGLang's and vLLM's --reasoning-parser names
TOOL_CALL_PARSERS = ("qwen25", "qwen", "llama3", "mistral")  # SGLang's --tool-call-parser names


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
class EngineConfig:
    """What a user chooses when starting an Engine or a server."""

    model_path: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    quantization: str | None = None  # None | int8 (weight-only, per output channel)
    device: str = "cpu"
    attention_backend: str | None = None  # None: flashinfer on cuda, torch_native on cpu
    page_size: int = 1
    max_total_tokens: int | None = None  # KV slots; None: from kv_cache_bytes
    kv_cache_bytes: int = 1 << 30
    max_running_requests: int = 64
    # SGLang's --max-queued-requests: beyond this many waiting requests a new one is refused
    # (HTTP 429 with Retry-After); None: no bound
    max_queued_requests: int | None = None
    max_context_len: int | None = None  # None: the model's max_position_embeddings
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 512  # None or <= 0: no chunking
    # a continuing chunk is cut so whole short prompts queued behind it run in the same step;
    # it keeps at least the min (None: half the chunk budget). SGLang's names (policy/interleave.py).
    # On by default: chosen by measurement (benchmarks/README.md, "Schedule policies")
    enable_prefill_interleaving: bool = True
    prefill_interleaving_min_continuation_tokens: int | None = None
    schedule_policy: str = (
        "adaptive"  # chosen by measurement: benchmarks/README.md, "Schedule policies"
    )
    disable_radix_cache: bool = False
    # a second KV tier under the radix tree (docs/kv_tier.md): host memory
    # (enable_hierarchical_cache, SGLang's name) or a memory-mapped file in kv_tier_path that
    # survives a restart; kv_tier_bytes None: twice the pool's bytes (SGLang's hicache ratio 2)
    enable_hierarchical_cache: bool = False
    kv_tier_path: str | None = None
    kv_tier_bytes: int | None = None
    kv_tier_write_policy: str = "write_back"
    # SGLang's --kv-events-config (JSON): publish the radix tree's changes (radix/kv_events.py)
    kv_events_config: str | None = None
    dp_rank: int = 0  # set by serve --dp-size for each worker; its KV events carry it
    # what preemption and retraction do with the victim's KV: cache it and recompute what was
    # evicted (recompute), or move it to the tier, pinned until it resumes (swap; needs a tier)
    preemption_mode: str = "recompute"
    disable_overlap_schedule: bool = False
    overlap_launch: str = "thread"  # one of OVERLAP_LAUNCHES
    # CUDA only: decode steps of up to cuda_graph_max_bs rows (None: max_running_requests, at
    # most 256) replayed from CUDA graphs captured at start (runtime/cuda_graph.py)
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    # structured output: emit a grammar's forced text in one extend step (docs/structured_output.md)
    disable_jump_forward: bool = False
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False  # SGLang default: larger value = more urgent
    random_seed: int = 0
    # tensor parallelism: ranks that each hold a slice of the model (docs/tensor_parallel.md);
    # rank 0 schedules, the others run the model only. Collectives time out after tp_timeout_s
    tp_size: int = 1
    # tensor parallelism over several machines (SGLang's names): nnodes machines of
    # tp_size / nnodes ranks each meet at dist_init_addr (HOST:PORT, node 0's address); node 0
    # serves, the others only run their ranks (docs/tensor_parallel.md)
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    tp_timeout_s: float = 120.0
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
    # LoRA adapters (docs/lora.md): (name, directory) served from the start, more loaded at
    # run time; at most max_loras_per_batch distinct ones per batch, max_loaded_loras in memory
    # (None: all), ranks up to max_lora_rank
    lora_paths: tuple[tuple[str, str], ...] = ()
    max_loras_per_batch: int = 8
    max_loaded_loras: int | None = None
    max_lora_rank: int = 64
    # speculative decoding from text already seen (docs/speculative.md), SGLang's names:
    # "NGRAM" or None (off); num_draft_tokens counts the tokens a request computes in one
    # verify (its last one and up to num_draft_tokens - 1 drafts); match windows in tokens;
    # capacity: tokens of the tree's cached sequences indexed; max_batch_size: no drafts above
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 8
    speculative_ngram_min_match_window_size: int = 2
    speculative_ngram_max_match_window_size: int = 12
    speculative_ngram_capacity: int = 1 << 18
    speculative_ngram_max_batch_size: int | None = None
    constants: SchedulerConstants = field(default_factory=SchedulerConstants)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_paths", lora_path_pairs(self.lora_paths))
        if self.max_lora_rank < 1 or self.max_loras_per_batch < 1:
            raise ValueError("max_lora_rank and max_loras_per_batch must be >= 1")
        if self.max_loaded_loras is not None and self.max_loaded_loras < self.max_loras_per_batch:
            raise ValueError("max_loaded_loras must be >= max_loras_per_batch")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}"
            )
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        self._check_nodes()
        if self.tp_timeout_s <= 0:
            raise ValueError(f"tp_timeout_s must be > 0, got {self.tp_timeout_s}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ValueError("cuda_graph_max_bs must be >= 1")
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS} or None, got {self.quantization!r}"
            )
        if self.cpu_isa is not None and self.cpu_isa not in CPU_ISAS:
            raise ValueError(f"cpu_isa must be one of {CPU_ISAS} or None, got {self.cpu_isa!r}")
        self._check_kv_tier()
        self._check_speculative()
        if self.kv_events_config is not None:
            KVEventsConfig.from_cli(self.kv_events_config)  # a ValueError naming the field
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )

    def _check_speculative(self) -> None:
        if self.speculative_algorithm not in (None, "NGRAM"):
            raise ValueError(
                f"speculative_algorithm must be NGRAM or None, got {self.speculative_algorithm!r}"
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

    def _check_nodes(self) -> None:
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

    @property
    def kv_events(self) -> KVEventsConfig | None:
        """The KV event publisher's config, or None when publishing is off."""
        if self.kv_events_config is None:
            return None
        config = KVEventsConfig.from_cli(self.kv_events_config)
        return config if config.enabled else None

    @property
    def kv_tier_enabled(self) -> bool:
        return self.enable_hierarchical_cache or self.kv_tier_path is not None

    def _check_kv_tier(self) -> None:
        if self.kv_tier_write_policy not in KV_TIER_WRITE_POLICIES:
            raise ValueError(
                f"kv_tier_write_policy must be one of {KV_TIER_WRITE_POLICIES}, "
                f"got {self.kv_tier_write_policy!r}"
            )
        if self.overlap_launch not in OVERLAP_LAUNCHES:
            raise ValueError(
                f"overlap_launch must be one of {OVERLAP_LAUNCHES}, got {self.overlap_launch!r}"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )
        if self.kv_tier_bytes is not None and self.kv_tier_bytes <= 0:
            raise ValueError(f"kv_tier_bytes must be > 0, got {self.kv_tier_bytes}")
        if self.preemption_mode == "swap" and not self.kv_tier_enabled:
            raise ValueError(
                "preemption_mode='swap' needs a KV tier (--kv-tier-path or "
                "--enable-hierarchical-cache)"
            )
        if self.kv_tier_enabled and self.disable_radix_cache:
            raise ValueError("a KV tier keeps the radix cache's prefixes: it needs the cache on")
        if self.kv_tier_enabled and self.tp_size > 1:
            raise ValueError("a KV tier with tensor parallelism is not supported yet")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


DEFAULT_MODEL_NAME = "radixserve-smoke-test-random"
DEFAULT_MODEL_DIR_ENV = "RADIXSERVE_DEFAULT_MODEL_DIR"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What ``radixserve serve`` chooses beyond the engine: where to listen, who may call.

    ``served_model_name`` is the name ``/v1/models`` lists and the OpenAI routes accept (the
    model path and the directory's name are accepted too); ``None``: the model path as given,
    as SGLang does (clients such as SGLang's ``bench_serving`` load the tokenizer from it).
    ``tool_call_parser``: the tool-call format of the chat route's ``tool_choice=auto``
    (``qwen25`` or ``qwen``, ``llama3``, ``mistral``); ``None``: the one the chat template
    teaches. ``reasoning_parser``
    (``qwen3``, ``deepseek-r1``): the chat routes return the thinking as ``reasoning_content``.
    ``chat_template``: the text of a Jinja chat template that replaces the checkpoint's. ``is_default_model``
    marks the embedded random-weight smoke-test model, so the log and ``/v1/models`` say so.
    """

    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 30000
    # SGLang's gRPC scheduler service on this port too, for smg's gRPC workers (api/grpc/server.py)
    grpc_port: int | None = None
    api_key: str | None = None  # one key: one tenant (the CLI's first --api-key)
    # (tenant, key) pairs: --api-key (each its own tenant) and --api-keys-file; api_key alone
    # becomes one pair. Each tenant has its own prompt-cache namespace unless
    # shared_prefix_cache; admin_api_keys may use /cache_tree, /dashboard, /flush_cache
    tenant_keys: tuple[tuple[str, str], ...] = ()
    admin_api_keys: tuple[str, ...] = ()
    # the key a --dp-size launcher gives its gateway to reach the workers (api/access/tenants.py): no
    # operator, so what the gateway serves without a key (smg's /engine_metrics) shows nothing
    gateway_api_keys: tuple[str, ...] = ()
    shared_prefix_cache: bool = False
    # a request header a trusted gateway sets to the tenant (e.g. x-tenant-id); None: keys only
    tenant_header: str | None = None
    served_model_name: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None  # the template's text (the CLI reads --chat-template FILE)
    # chat prompts: special-token text in a request's messages and tools becomes the special
    # token, as transformers renders it (False: it is tokenized as plain text; see
    # server/content_guard.py)
    allow_special_tokens_in_content: bool = False
    is_default_model: bool = False
    log_level: str = "info"
    startup_timeout_s: float = 600.0  # loading the model in the scheduler process
    default_max_new_tokens: int = 128  # /generate without max_new_tokens (SGLang's default)
    # limits on one HTTP request (bad or hostile input is refused before it costs anything)
    max_request_bytes: int = 4 << 20  # body size; 413 past it
    # open HTTP connections (None: the descriptor limit less a reserve), how long a new one
    # may take to send a request head, how long a body may take after its head and the rate it
    # must keep up once the header timeout has passed (bytes/s, 0: none) (launch/connections.py)
    max_connections: int | None = None
    request_header_timeout_s: float = 10.0
    request_body_timeout_s: float = 30.0
    min_request_body_rate: float = 500.0
    max_batch_sub_requests: int = 1024  # prompts x n of one request; 400 past it
    max_stop_strings: int = 256  # OpenAI allows 4; SGLang users send more; 400 past it
    max_stored_responses: int = 4096  # the Responses API's, every tenant's; LRU out past it
    disable_docs: bool = False  # no /docs, /redoc, /openapi.json
    # on SIGTERM: in-flight requests may finish for this long, then are aborted (closing event)
    graceful_shutdown_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.engine.model_path is None:
            raise ValueError("ServerConfig needs engine.model_path (resolve the default first)")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65536), got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be non-empty when given")
        keys = (*(k for _, k in self.tenant_keys), *self.admin_api_keys, *self.gateway_api_keys)
        if not all(keys):
            raise ValueError("API keys must be non-empty")
        reserved = {"admin", "gateway"} & {tenant for tenant, _ in self.tenant_keys}
        if reserved:
            raise ValueError(f"the tenant name {reserved.pop()!r} is reserved; name it otherwise")
        if self.api_key is not None and not self.tenant_keys:
            object.__setattr__(self, "tenant_keys", (("default", self.api_key),))
        elif self.api_key is None and (self.tenant_keys or self.admin_api_keys):
            first = self.tenant_keys[0][1] if self.tenant_keys else self.admin_api_keys[0]
            object.__setattr__(self, "api_key", first)  # the router's and the log's key
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.request_header_timeout_s <= 0:
            raise ValueError("request_header_timeout_s must be > 0")
        if self.request_body_timeout_s <= 0:
            raise ValueError("request_body_timeout_s must be > 0")
        if self.min_request_body_rate < 0:
            raise ValueError("min_request_body_rate must be >= 0")
        for name in (
            "max_request_bytes",
            "max_batch_sub_requests",
            "max_stop_strings",
            "max_stored_responses",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}")
        if self.reasoning_parser not in (None, *REASONING_PARSERS):
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}")
        if self.graceful_shutdown_timeout_s < 0:
            raise ValueError("graceful_shutdown_timeout_s must be >= 0")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.is_default_model:
            return DEFAULT_MODEL_NAME
        assert self.engine.model_path is not None
        return self.engine.model_path


def cache_dir() -> str:
    """radixserve's cache: ``$XDG_CACHE_HOME/radixserve``, else ``~/.cache/radixserve``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "radixserve")


def default_model_dir() -> str:
    """Where the embedded default model lives: ``$RADIXSERVE_DEFAULT_MODEL_DIR``, else
    ``default-model`` in :func:`cache_dir`."""
    explicit = os.environ.get(DEFAULT_MODEL_DIR_ENV)
    if explicit:
        return os.path.expanduser(explicit)
    return os.path.join(cache_dir(), "default-model")


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
