"""Attention backend registry: name -> backend class, imported lazily.

``flashinfer`` is only imported when chosen, so the package imports (and runs on CPU) without it.
"""

from __future__ import annotations

import importlib

import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionBackend, AttentionSpec

# name -> (module, class)
ATTENTION_BACKENDS: dict[str, tuple[str, str]] = {
    "torch_native": ("radixserve.models.attention.torch_native", "TorchNativeBackend"),
    "flashinfer": ("radixserve.models.attention.flashinfer_backend", "FlashInferBackend"),
}


def default_backend_name(device: torch.device) -> str:
    """flashinfer on CUDA, torch_native elsewhere."""
    return "flashinfer" if device.type == "cuda" else "torch_native"


def create_attention_backend(
    name: str | None,
    spec: AttentionSpec,
    kv_cache: KVCache,
    req_to_token_pool: ReqToTokenPool,
    cpu_kernel: bool = True,
) -> AttentionBackend:
    """Build the backend ``name`` (``None``: the device default). ``ValueError`` for an unknown name.

    ``cpu_kernel``: let ``torch_native`` use the AVX512-BF16 attention kernel where it can."""
    name = name or default_backend_name(kv_cache.device)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}"
        )
    module_name, class_name = ATTENTION_BACKENDS[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    options = {"cpu_kernel": cpu_kernel} if name == "torch_native" else {}
    backend: AttentionBackend = cls(spec, kv_cache, req_to_token_pool, **options)
    return backend
