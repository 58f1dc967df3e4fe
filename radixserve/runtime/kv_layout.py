"""KVLayout: what sizes the KV pools of a model, read from its ``config.json`` (no weights).

Both owners of KV memory take it from here: the ``KVManager`` of rank 0 and the process of each
other tensor-parallel rank (``tp_worker.py``), which builds the same pools for its slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool, num_slots_for_budget
from radixserve.models.kernels import CpuKernels
from radixserve.models.model_config import ModelConfig
from radixserve.models.numerics import cpu_kernels_for, model_dtype
from radixserve.models.parallel import check_tp_shapes, local_num_kv_heads


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What sizes the pools: the model's KV shape (one tensor-parallel rank's KV heads), the
    dtype, the device, the context length."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    max_context_len: int

    @classmethod
    def from_config(cls, config: EngineConfig, cpu_kernels: CpuKernels | None = None) -> KVLayout:
        """Read the checkpoint's ``config.json`` (no weights). The dtype is the model's, which
        under ``auto`` depends on the CPU kernels (default: ``cpu_kernels_for(config)``)."""
        if config.model_path is None:
            raise ValueError("the engine needs config.model_path (a local checkpoint directory)")
        mc = ModelConfig.from_dir(config.model_path)
        check_tp_shapes(mc, config.parallel.tp_size)
        kernels = cpu_kernels if cpu_kernels is not None else cpu_kernels_for(config)
        return cls(
            mc.num_layers,
            local_num_kv_heads(mc.num_kv_heads, config.parallel.tp_size),
            mc.head_dim,
            model_dtype(config, kernels),
            torch.device(config.device),
            config.max_context_len or mc.max_position_embeddings,
        )

    def build_pools(self, config: EngineConfig) -> tuple[KVCache, ReqToTokenPool]:
        """The K/V buffers (:func:`num_kv_slots` slots) and the request rows of ``config``."""
        kv_cache = KVCache(
            self.num_layers,
            num_kv_slots(config, self),
            self.num_kv_heads,
            self.head_dim,
            self.dtype,
            self.device,
        )
        rows = ReqToTokenPool(
            config.admission.max_running_requests, self.max_context_len, self.device
        )
        return kv_cache, rows


def num_kv_slots(config: EngineConfig, layout: KVLayout) -> int:
    """Slots of the pool: ``max_total_tokens`` usable slots rounded up to whole pages plus the
    reserved padding page, or as many as ``kv_cache_bytes`` holds."""
    page = config.page_size
    if config.max_total_tokens is not None:
        if config.max_total_tokens < 1:
            raise ValueError("max_total_tokens must be >= 1")
        return (-(-config.max_total_tokens // page) + 1) * page
    return num_slots_for_budget(
        config.kv_cache_bytes,
        layout.num_layers,
        layout.num_kv_heads,
        layout.head_dim,
        layout.dtype,
        page,
    )
