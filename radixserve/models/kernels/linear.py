"""The torch reference of the dense layers, for weights stored narrower than they compute.

:func:`torch_linear` is ``F.linear`` for fp32/bf16 weights and dequantizes int8 weights
(:func:`quantize_int8`: symmetric, one fp32 scale per output channel) first; the skinny GEMM of
``gemv.cpp`` (through :class:`~radixserve.models.kernels.cpu_kernels.CpuKernels`) computes the
same products with the widening done in registers.
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


def torch_linear(
    x: torch.Tensor,  # [..., in]
    weight: torch.Tensor,  # [out, in] fp32, bf16, fp16 or int8
    bias: torch.Tensor | None = None,  # [out]
    scale: torch.Tensor | None = None,  # [out] fp32, with int8 weights
    fp32_compute: bool = False,
) -> torch.Tensor:  # [..., out] in x's dtype
    """``(x @ weight.T) * scale + bias`` with torch ops. ``fp32_compute``: a bf16 product runs in
    float32 and is rounded once (for CPUs that emulate bf16 GEMMs slowly)."""
    if scale is not None:
        weight = weight * scale[:, None]  # int8 * fp32 promotes: one pass, fp32 out
    if fp32_compute and x.dtype == torch.bfloat16 and x.numel():
        b = None if bias is None else bias.float()
        return F.linear(x.float(), weight.float(), b).to(x.dtype)
    return F.linear(x, weight.to(x.dtype), bias)
