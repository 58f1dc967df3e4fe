"""Fast CPU kernels, one C++ source built per ISA variant (``_ext``): decode-shaped products
(skinny GEMM over fp32/bf16/int8 weights), paged attention, RMSNorm and the pointwise operations
of a layer (SiLU-and-mul, RoPE, the KV store). A model receives its
:class:`CpuKernels` at construction; :data:`TORCH_ONLY` is the torch reference; on CUDA,
:class:`CudaKernels` runs FlashInfer's fused norm and activation."""

from radixserve.models.kernels.attention import AttentionKernel
from radixserve.models.kernels.cpu_kernels import MAX_M, TORCH_ONLY, TORCH_Q8, CpuKernels
from radixserve.models.kernels.cuda_kernels import CudaKernels
from radixserve.models.kernels.linear import (
    Q8_BLOCK,
    q8_reference,
    quantize_int8,
    quantize_rows_q8,
    torch_linear,
)

__all__ = [
    "AttentionKernel",
    "CpuKernels",
    "CudaKernels",
    "MAX_M",
    "Q8_BLOCK",
    "TORCH_ONLY",
    "TORCH_Q8",
    "q8_reference",
    "quantize_int8",
    "quantize_rows_q8",
    "torch_linear",
]
