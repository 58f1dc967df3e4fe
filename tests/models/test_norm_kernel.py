"""radixserve.models.kernels.norm: the one-call bf16 RMSNorm against F.rms_norm.

F.rms_norm on CPU computes bf16 rows in fp32 and rounds once; the kernel does the same math,
so decode- and chunk-sized inputs match bit for bit (very long batches may differ by an ulp
where torch changes its summation order, not tested here).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from radixserve.models import kernels
from radixserve.models.kernels import _ext
from radixserve.models.kernels.norm import rms_norm

pytestmark = pytest.mark.skipif(
    torch.bfloat16 not in _ext.supported_dtypes() or _ext.load_extension() is None,
    reason="no AVX512-BF16 CPU kernels here",
)


@pytest.mark.parametrize("shape", [(1, 896), (8, 896), (3, 5, 40), (64, 128), (2, 17)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_f_rms_norm_bit_for_bit(shape: tuple[int, ...], with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    dim = shape[-1]
    x = (torch.randn(shape, generator=gen) * 3).to(torch.bfloat16)
    res = torch.randn(shape, generator=gen).to(torch.bfloat16) if with_residual else None
    w = (torch.randn(dim, generator=gen) * 0.5 + 1).to(torch.bfloat16)
    out, s = rms_norm(x, w, 1e-6, res)
    s_ref = x if res is None else x + res
    assert torch.equal(s, s_ref)
    assert torch.equal(out, F.rms_norm(s_ref, (dim,), w, 1e-6))
    assert _ext.loaded_extension() is not None  # the kernel route, not the fallback


def test_the_dense_layers_switch_turns_it_off() -> None:
    x = torch.randn(2, 40).to(torch.bfloat16)
    w = torch.ones(40, dtype=torch.bfloat16)
    before = kernels.is_enabled()
    kernels.set_enabled(False)
    try:
        with mock.patch.object(_ext.loaded_extension(), "try_rms_norm", side_effect=AssertionError):
            out, _ = rms_norm(x, w, 1e-6)  # would raise if the kernel were called
    finally:
        kernels.set_enabled(before)
    assert torch.equal(out, F.rms_norm(x, (40,), w, 1e-6))


def test_falls_back_for_what_it_cannot_take() -> None:
    x = torch.randn(4, 32)
    w = torch.rand(32) + 0.5
    out, s = rms_norm(x, w, 1e-5)  # float32: F.rms_norm itself
    assert s is x and torch.equal(out, F.rms_norm(x, (32,), w, 1e-5))
    xb = torch.randn(32, 4).to(torch.bfloat16).t()  # [4, 32], not contiguous
    wb = w.to(torch.bfloat16)
    out, _ = rms_norm(xb, wb, 1e-5)
    assert torch.equal(out, F.rms_norm(xb, (32,), wb, 1e-5))
