"""The torch reference of the dense layers, for weights stored narrower than they compute.

:func:`torch_linear` is ``F.linear`` for fp32/bf16 weights and widens int8 weights
(:func:`quantize_int8`: symmetric, one fp32 scale per output channel) first, applying the scales
to the output. The skinny GEMM of ``gemv.cpp`` (through
:class:`~radixserve.models.kernels.cpu_kernels.CpuKernels`, for decode-shaped products)
computes the same fp32/bf16 products with the widening done in registers; with int8 weights it
multiplies them by ``x`` quantized to int8 (:func:`quantize_rows_q8`), per block of 32 at batch
1 (what llama.cpp's Q8_0 does to activations) and per row from two rows on (as the int8 GEMMs
do), so its reference is :func:`q8_reference` of ``x`` times the dequantized weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ``[out, in]`` -> (int8 ``[out, in]``, fp32 scales ``[out]``) with
    ``weight ~= q * scale[:, None]``: per output channel, symmetric, ``|q| <= 127``."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


Q8_BLOCK = 32
"""Values of ``x`` per int8 scale in the kernel's int8 products (llama.cpp's Q8_0 block)."""

Q8_ROW_MAX_K = 1 << 17
"""Longest row of ``x`` the skinny GEMM quantizes per row (its int32 sums hold ``K`` products of
at most 127 * 128); longer rows keep Q8_0 blocks at every batch size (gemv_lanes.h)."""


def quantize_rows_q8(x: torch.Tensor, block: int = Q8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[..., K]`` -> (int8 ``[..., K]``, fp32 scales ``[..., ceil(K / block)]``), as the
    kernel quantizes ``x`` (gemv_lanes.h ``quantize_row_q8``, the same fp32 operations): per
    block of 32, ``d = max|x| / 127``, ``q = round_half_even(x * (1 / d))``, 0 where ``d = 0``.
    ``block = K``: one scale per row, as the AMX GEMM quantizes ``x`` (amx_gemm.cpp)."""
    k = x.shape[-1]
    blocks = F.pad(x.float(), (0, -k % block)).unflatten(-1, (-1, block))
    d = blocks.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv[..., None]).to(torch.int8)
    return q.flatten(-2)[..., :k], d


def q8_reference(x: torch.Tensor, block: int = Q8_BLOCK) -> torch.Tensor:
    """What the kernel's int8 products see of ``x``: its quantization in blocks of ``block``
    (``K``: per row), dequantized (fp32)."""
    q, d = quantize_rows_q8(x, block)
    k = x.shape[-1]
    full = F.pad(q.float(), (0, -k % block)).unflatten(-1, (-1, block)) * d[..., None]
    return full.flatten(-2)[..., :k]


def torch_linear(
    x: torch.Tensor,  # [..., in]
    weight: torch.Tensor,  # [out, in] fp32, bf16, fp16 or int8
    bias: torch.Tensor | None = None,  # [out]
    scale: torch.Tensor | None = None,  # [out] fp32, with int8 weights
    fp32_compute: bool = False,
) -> torch.Tensor:  # [..., out] in x's dtype
    """``(x @ weight.T) * scale + bias`` with torch ops. ``fp32_compute``: a bf16 product runs in
    float32 and is rounded once (for CPUs that emulate bf16 GEMMs slowly)."""
    if scale is not None:  # int8 weights: exact in bf16 and fp32; the scales go on the output
        fp32 = fp32_compute or x.dtype == torch.float32
        y = F.linear(x.float() if fp32 else x, weight.to(torch.float32 if fp32 else x.dtype))
        y = y.float() * scale
        return (y if bias is None else y + bias.float()).to(x.dtype)
    if fp32_compute and x.dtype == torch.bfloat16 and x.numel():
        b = None if bias is None else bias.float()
        return F.linear(x.float(), weight.float(), b).to(x.dtype)
    return F.linear(x, weight.to(x.dtype), bias)
