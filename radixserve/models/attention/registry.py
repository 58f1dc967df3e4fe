"""Attention backend registry: name -> backend class, imported lazily.

``flashinfer`` is only imported when chosen, so the package imports (and runs on CPU) without it.
On CPU the default is ``cpu_kernel`` where the model's kernels can run its KV, else the
pure-torch ``torch_native`` (the reference).
"""

from __future__ import annotations

import importlib

import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention import cpu_kernel
from radixserve.models.attention.base import AttentionBackend, AttentionSpec
from radixserve.models.kernels import CpuKernels

# name -> (module, class)
ATTENTION_BACKENDS: dict[str, tuple[str, str]] = {
    "torch_native": ("radixserve.models.attention.torch_native", "TorchNativeBackend"),
    "cpu_kernel": ("radixserve.models.attention.cpu_kernel", "CpuKernelBackend"),
    "flashinfer": ("radixserve.models.attention.flashinfer_backend", "FlashInferBackend"),
}


def default_backend_name(device: torch.device, usable_cpu_kernel: bool = False) -> str:
    """flashinfer on CUDA, cpu_kernel where usable, torch_native elsewhere."""
    if device.type == "cuda":
        return "flashinfer"
    return "cpu_kernel" if usable_cpu_kernel else "torch_native"


def create_attention_backend(
    name: str | None,
    spec: AttentionSpec,
    kv_cache: KVCache,
    req_to_token_pool: ReqToTokenPool,
    cpu_kernels: CpuKernels | None = None,
    decode_tensor_cores: bool | None = None,
) -> AttentionBackend:
    """Build the backend ``name`` (``None``: the device default). ``ValueError`` for an unknown
    name, or ``cpu_kernel`` without a kernel for this KV in ``cpu_kernels``.
    ``decode_tensor_cores``: FlashInfer's decode kernels (``ExecutionConfig``'s
    ``flashinfer_decode_tensor_cores``)."""
    usable = cpu_kernel.usable(cpu_kernels, kv_cache, spec)
    name = name or default_backend_name(kv_cache.device, usable)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}"
        )
    module_name, class_name = ATTENTION_BACKENDS[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    options: dict[str, object] = {}
    if name == "cpu_kernel":
        options["kernels"] = cpu_kernels
    elif name == "flashinfer":
        options["decode_tensor_cores"] = decode_tensor_cores
    if name == "cpu_kernel" and not usable:
        raise ValueError(f"the cpu_kernel attention backend cannot run {kv_cache.dtype} KV here")
    backend: AttentionBackend = cls(spec, kv_cache, req_to_token_pool, **options)
    return backend
