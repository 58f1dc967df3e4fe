"""Building blocks of the decoder: linear, RMSNorm, rotary embedding, SwiGLU MLP.

``apply_rotary`` (the torch reference of RoPE) lives in ``kernels/pointwise.py`` beside the
kernel's and is re-exported here.

Parameters are allocated uninitialised (``torch.empty``) in the target dtype and device; the
loader fills them. Numerics follow transformers (the correctness oracle): RMSNorm computes in
float32, RoPE multiplies in the activation dtype with cos/sin computed in float32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from radixserve.models.kernels import TORCH_ONLY, CpuKernels, quantize_int8
from radixserve.models.kernels.pointwise import apply_rotary
from radixserve.models.lora import LoraBatch
from radixserve.models.model_config import RopeConfig
from radixserve.models.parallel import SINGLE, TPGroup

__all__ = ["Linear", "RMSNorm", "RotaryEmbedding", "SwiGLUMLP", "apply_rotary", "empty_param"]


def empty_param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """``y = x @ weight.T + bias`` through ``kernels.linear``; :meth:`quantize_int8` switches the
    weight to int8 with per-channel scales (``weight_scale``, ``None`` before)."""

    weight_scale: torch.Tensor | None  # a buffer: [out] fp32 while the weight is int8

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
        kernels: CpuKernels = TORCH_ONLY,
    ) -> None:
        super().__init__()
        # weight [out, in], bias [out]
        self.weight = empty_param(out_features, in_features, dtype=dtype, device=device)
        self.bias = empty_param(out_features, dtype=dtype, device=device) if bias else None
        self.register_buffer("weight_scale", None)
        self.kernels = kernels

    def quantize_int8(self) -> None:
        """Replace the loaded weight by its int8 quantization (see ``quantize_int8``)."""
        q, scale = quantize_int8(self.weight)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return self.kernels.linear(x, self.weight, self.bias, self.weight_scale)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, optionally fused with the residual add.

    ``norm(x)`` returns the normalised ``x``; ``norm(x, residual)`` first forms
    ``s = x + residual`` and returns ``(norm(s), s)``, so a layer passes the running sum on.
    """

    def __init__(
        self,
        dim: int,
        eps: float,
        dtype: torch.dtype,
        device: torch.device,
        kernels: CpuKernels = TORCH_ONLY,
    ) -> None:
        super().__init__()
        self.weight = empty_param(dim, dtype=dtype, device=device)  # [dim]
        self.eps = eps
        self.dim = dim
        self.kernels = kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out, s = self.kernels.rms_norm(x, self.weight, self.eps, residual)
        return out if residual is None else (out, s)


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[head_dim // 2]`` (float32) and the cos/sin scale, as transformers
    computes them for ``rope_type`` default, linear, llama3 and yarn."""
    base, dim = rope.theta, head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(dim, rope)
    raise ValueError(f"unsupported rope_type {rope.rope_type!r}")


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = float(rope.original_max_position_embeddings or 8192)
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(dim: int, rope: RopeConfig) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor
    orig = rope.original_max_position_embeddings or 4096

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = get_mscale(factor, rope.mscale) / get_mscale(
                factor, rope.mscale_all_dim
            )
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    inv_extra, inv_inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    inv_freq = inv_inter * (1 - extrapolation_factor) + inv_extra * extrapolation_factor
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE with cos/sin cached for positions ``0 .. max_positions - 1``.

    :meth:`cos_sin` gathers the tables once per forward; :func:`apply_rotary` (or
    :meth:`CpuKernels.rotary`) uses them in every layer. ``sin`` is stored with its first half negated so that rotating needs one swap of the
    two halves instead of ``cat(-x2, x1)`` (bit-identical to transformers' ``rotate_half``).
    """

    cos_cache: torch.Tensor
    sin_cache: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        rope: RopeConfig,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        inv_freq, scale = rope_inv_freq(head_dim, rope)
        pos = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [max_positions, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * scale).to(dtype)
        sin = (emb.sin() * scale).to(dtype)
        half = head_dim // 2
        sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        # both [max_positions, head_dim]
        self.register_buffer("cos_cache", cos.to(device), persistent=False)
        self.register_buffer("sin_cache", sin_signed.to(device), persistent=False)
        self.max_positions = max_positions

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` ``[num_tokens]`` -> cos, signed sin, each ``[num_tokens, 1, head_dim]``."""
        return self.cos_cache[positions].unsqueeze(1), self.sin_cache[positions].unsqueeze(1)


class SwiGLUMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up merged into one ``[2 * inter, hidden]`` weight.

    Under tensor parallelism ``inter`` is this rank's share of the columns: gate/up are
    column-parallel, down is row-parallel (its bias added by rank 0 alone), then one all-reduce.
    """

    def __init__(
        self,
        hidden: int,
        inter: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
        kernels: CpuKernels = TORCH_ONLY,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.inter = inter
        self.tp = tp
        self.kernels = kernels
        self.gate_up_proj = Linear(hidden, 2 * inter, bias, dtype, device, kernels)
        self.down_proj = Linear(inter, hidden, bias and tp.rank == 0, dtype, device, kernels)

    def forward(
        self, x: torch.Tensor, lora: LoraBatch | None = None, layer_id: int = 0
    ) -> torch.Tensor:  # [num_tokens, hidden]; ``lora``: the batch's adapters, at ``layer_id``
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * inter]
        if lora is not None:
            lora.add(layer_id, "gate_up_proj", x, gate_up, self.kernels)
        act = self.kernels.silu_mul(gate_up)
        out = self.down_proj(act)
        if lora is not None:
            lora.add(layer_id, "down_proj", act, out, self.kernels)
        return self.tp.all_reduce(out)
