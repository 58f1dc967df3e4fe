"""The torch reference of the per-layer pointwise operations (``pointwise.cpp`` computes the same
in one call each, through :class:`~radixserve.models.kernels.cpu_kernels.CpuKernels`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[num_tokens, 2 * inter]`` = ``[gate | up]``."""
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :inter]) * gate_up[..., inter:]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[num_tokens, num_heads, head_dim]`` by the tables of
    :class:`~radixserve.models.layers.RotaryEmbedding` (``sin`` with its first half negated)."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)  # cat(x2, x1)
    return x * cos + swapped * sin
