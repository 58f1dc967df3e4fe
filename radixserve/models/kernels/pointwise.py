"""The torch reference of the per-layer pointwise operations (``pointwise.cpp`` computes the same
in one call each, through :class:`~radixserve.models.kernels.cpu_kernels.CpuKernels`)."""

from __future__ import annotations

from collections.abc import Callable

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


def split_rope(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    qk_norm: tuple[torch.Tensor, float] | None = None,
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rotary,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qkv`` ``[num_tokens, (heads + 2 * kv_heads) * head_dim]`` -> q ``[num_tokens, heads,
    head_dim]``, k and v ``[num_tokens, kv_heads, head_dim]``, q and k rotated (after Qwen3's
    RMSNorm per head when ``qk_norm`` = (weight ``[heads + kv_heads, head_dim]``, eps)) by
    ``rotate``; v is a view of ``qkv``."""
    t, d = qkv.shape[0], cos.shape[-1]
    qk = qkv[:, : (heads + kv_heads) * d].view(t, heads + kv_heads, d)
    if qk_norm is not None:
        weight, eps = qk_norm
        qk = F.rms_norm(qk, (d,), None, eps) * weight
    qk = rotate(qk, cos, sin)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    return qk[:, :heads], qk[:, heads:], v
