"""The one numeric decision of a model: the CPU kernels it runs with and the dtype of its weights
and of its KV cache (under ``auto`` the dtype depends on the kernels).

It sits beside the model config, below its users: the KV owner sizes its pools with it, the
model runner loads the weights with it, and neither needs the other for it.
"""

from __future__ import annotations

import torch

from radixserve.config import EngineConfig
from radixserve.models.kernels import TORCH_ONLY, CpuKernels
from radixserve.models.kernels._ext import best_variant, cpu_has_native_bf16
from radixserve.models.kernels.cuda_kernels import CudaKernels

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_kernels_for(config: EngineConfig) -> CpuKernels:
    """The kernels a model of ``config`` runs with: on a CPU this CPU's best variant (built or
    loaded now, not on the first step), or the torch paths (switched off, no compiler); on CUDA
    the torch paths, or FlashInfer's fused ones where ``flashinfer_fused_ops`` asks."""
    if torch.device(config.device).type != "cpu":
        if config.execution.flashinfer_fused_ops:
            return CudaKernels.flashinfer()
        return TORCH_ONLY
    return CpuKernels.build(
        config.execution.cpu_isa,
        dense=not config.execution.disable_cpu_linear_kernel,
        attention=not config.execution.disable_cpu_attention_kernel,
    )


def resolve_dtype(
    name: str | torch.dtype, device: torch.device | str, kernels: CpuKernels | None = None
) -> torch.dtype:
    """``float32`` / ``bfloat16`` / ``float16`` / ``auto`` -> a torch dtype.

    ``auto`` is bfloat16 on CUDA, on CPUs with native bf16 (2-3x float32 GEMM there) and on CPUs
    whose dense kernels widen bf16 storage in registers (``kernels.dense``; without ``kernels``:
    any CPU with a kernel variant), where decode streams half the bytes of float32; float32 on
    other CPUs. ``ValueError`` for any other name.
    """
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        if torch.device(device).type == "cuda" or cpu_has_native_bf16():
            return torch.bfloat16
        widened = kernels.dense if kernels is not None else best_variant() is not None
        return torch.bfloat16 if widened else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    return _DTYPES[name]


def model_dtype(config: EngineConfig, cpu_kernels: CpuKernels) -> torch.dtype:
    """The one dtype of the weights and the KV cache (``auto`` depends on the kernels)."""
    return resolve_dtype(config.dtype, config.device, cpu_kernels)
