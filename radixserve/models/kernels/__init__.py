"""Fast CPU kernels: decode-shaped products (``F.linear`` is the reference path) and bf16 paged
attention (the torch-native backend's torch path is the reference)."""

from radixserve.models.kernels.attention import AttentionKernel, attention_kernel
from radixserve.models.kernels.linear import (
    MAX_M,
    is_available,
    is_enabled,
    linear,
    set_enabled,
    skinny_linear,
    warmup,
)

__all__ = [
    "AttentionKernel",
    "attention_kernel",
    "MAX_M",
    "is_available",
    "is_enabled",
    "linear",
    "set_enabled",
    "skinny_linear",
    "warmup",
]
