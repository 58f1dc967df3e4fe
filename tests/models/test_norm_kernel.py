"""The one-call RMSNorm of every ISA variant against F.rms_norm.

F.rms_norm on CPU computes bf16 rows in fp32 and rounds once; the kernel does the same math, so
decode- and chunk-sized bf16 inputs match bit for bit; fp32 rows differ only by the summation
order (relative 1e-6).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.models.kernels import TORCH_ONLY, CpuKernels


@pytest.mark.parametrize("shape", [(1, 896), (8, 896), (3, 5, 40), (64, 128), (2, 17)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_matches_f_rms_norm(
    variant_kernels: CpuKernels, shape: tuple[int, ...], with_residual: bool, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    dim = shape[-1]
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    res = torch.randn(shape, generator=gen).to(dtype) if with_residual else None
    w = (torch.randn(dim, generator=gen) * 0.5 + 1).to(dtype)
    assert variant_kernels.module is not None
    done = variant_kernels.module.try_rms_norm(x, w, res, 1e-6)  # the kernel route itself
    assert done is not None
    out, s = done
    s_ref = x if res is None else x + res
    assert torch.equal(s, s_ref)
    ref = F.rms_norm(s_ref, (dim,), w, 1e-6)
    if dtype == torch.bfloat16:
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_falls_back_for_what_it_cannot_take(variant_kernels: CpuKernels) -> None:
    w = torch.rand(32) + 0.5
    xb = torch.randn(32, 4).to(torch.bfloat16).t()  # [4, 32], not contiguous
    wb = w.to(torch.bfloat16)
    out, _ = variant_kernels.rms_norm(xb, wb, 1e-5)
    assert torch.equal(out, F.rms_norm(xb, (32,), wb, 1e-5))
    x = torch.randn(4, 32)
    out, s = TORCH_ONLY.rms_norm(x, w, 1e-5)  # the reference: F.rms_norm itself
    assert s is x and torch.equal(out, F.rms_norm(x, (32,), w, 1e-5))
