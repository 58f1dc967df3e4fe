"""Paged causal attention on CPU (``attention_kernel.cpp``), for the ``cpu_kernel`` backend.

:func:`attention_kernel` returns the kernel of a loaded extension for a model's KV dtype and
head size, or ``None`` where it cannot run (not float32/bfloat16, ``head_dim`` not a multiple of
16 or above 256). The kernel takes a whole EXTEND (or DECODE: one token per request) batch at
once, reads K/V through ``req_to_token`` itself, and is flash-attention style: K/V blocks
widened to fp32, fp32 scores, online softmax and accumulation, one rounding of the output.
"""

from __future__ import annotations

from types import ModuleType
from typing import Protocol

import torch

MAX_HEAD_DIM = 256


class AttentionKernel(Protocol):
    def __call__(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim], dense rows
        k_buf: torch.Tensor,  # [num_slots, num_kv_heads, head_dim], q's dtype
        v_buf: torch.Tensor,
        req_to_token: torch.Tensor,  # [rows, max_context_len] int32
        req_pool_indices: torch.Tensor,  # [bs] int64
        prefix_lens: torch.Tensor,  # [bs] int64: KV already cached before this step's tokens
        extend_lens: torch.Tensor,  # [bs] int64: this step's tokens (sum = num_tokens)
        num_heads: int,
        scale: float,
        window: int,  # <= 0: full attention, else keys at positions (p - window, p]
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim], q's dtype
        ...


def attention_kernel(
    module: ModuleType, dtype: torch.dtype, head_dim: int
) -> AttentionKernel | None:
    """``module``'s kernel for KV of ``dtype`` and ``head_dim``, or ``None`` if it cannot take them."""
    if dtype not in (torch.float32, torch.bfloat16):
        return None
    if head_dim % 16 or not 0 < head_dim <= MAX_HEAD_DIM:
        return None
    kernel: AttentionKernel = module.extend_attention
    return kernel
