"""Every knob of radixserve, as frozen dataclasses. The only place that reads the environment.

``EngineConfig`` (``engine.py``) is made of parts that each check their own fields:
``AdmissionConfig`` and ``SchedulerConstants`` (``admission.py``), ``KVTierConfig``,
``LoRAConfig``, ``ParallelConfig``, ``ExecutionConfig``, ``SpeculativeConfig`` (``parts.py``).
``ServerConfig`` (``server.py``) holds an ``EngineConfig`` and the server's own settings.
"""

from radixserve.config.admission import (
    PREEMPTION_MODES,
    SCHEDULE_POLICIES,
    AdmissionConfig,
    SchedulerConstants,
)
from radixserve.config.engine import DTYPES, PART_OF, PARTS, QUANTIZATIONS, EngineConfig
from radixserve.config.parts import (
    CPU_ISAS,
    KV_TIER_WRITE_POLICIES,
    OVERLAP_LAUNCHES,
    ExecutionConfig,
    KVTierConfig,
    LoRAConfig,
    ParallelConfig,
    SpeculativeConfig,
    lora_path_pairs,
)
from radixserve.config.server import (
    DEFAULT_MODEL_DIR_ENV,
    DEFAULT_MODEL_NAME,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ServerConfig,
    cache_dir,
    default_model_dir,
)

__all__ = [
    "CPU_ISAS",
    "DEFAULT_MODEL_DIR_ENV",
    "DEFAULT_MODEL_NAME",
    "DTYPES",
    "KV_TIER_WRITE_POLICIES",
    "OVERLAP_LAUNCHES",
    "PARTS",
    "PART_OF",
    "PREEMPTION_MODES",
    "QUANTIZATIONS",
    "REASONING_PARSERS",
    "SCHEDULE_POLICIES",
    "TOOL_CALL_PARSERS",
    "AdmissionConfig",
    "EngineConfig",
    "ExecutionConfig",
    "KVTierConfig",
    "LoRAConfig",
    "ParallelConfig",
    "SchedulerConstants",
    "ServerConfig",
    "SpeculativeConfig",
    "cache_dir",
    "default_model_dir",
    "lora_path_pairs",
]
