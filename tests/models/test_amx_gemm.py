"""The int8 GEMM on AMX tiles (``amx_gemm.cpp``, the ``amx`` variant) against torch.

Reference: F.linear in float32 of ``x`` quantized per row (``q8_reference(x, K)``, the same fp32
operations as the kernel's quantization) times the dequantized weight. The kernel's int32 sums
over all of K are exact; one fp32 scaling and one rounding to x's dtype follow, so the tolerance
is ``test_kernels``' (half a bf16 ulp, fp32 summation noise). Every test here needs a CPU with
AMX-INT8 and AMX-BF16 (Sapphire Rapids or later) and is skipped, naming the variant, elsewhere.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_kernels import _assert_close, _weights, on_one_and_many_threads

from radixserve.models.kernels import MAX_M, TORCH_Q8, CpuKernels, _ext, q8_reference, quantize_int8

pytestmark = pytest.mark.skipif(
    not _ext.can_execute("amx"), reason="this CPU cannot execute the amx kernel variant"
)


@pytest.fixture(scope="module")
def amx() -> CpuKernels:
    kernels = CpuKernels.build("amx")
    assert kernels.variant == "amx", "the amx variant failed to build (see _ext's log)"
    return kernels


# N: whole 32-row blocks, a 16-row block, ragged; K: whole 64-byte blocks and tails (the padded
# copy of the weight rows), one large enough to chunk the rows of x; M: ragged 16-row tiles, tall
# (max_m = 0 below: the AMX GEMM at every M, even where linear() keeps the skinny GEMM).
SHAPES = [(32, 64), (48, 128), (7, 5), (37, 33), (129, 256), (301, 2100), (64, 4864)]
MS = [2, 5, 33, 40, 64, 100, 129, 300]


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_amx_gemm_matches_reference(amx: CpuKernels, x_dtype: torch.dtype) -> None:
    assert amx.module is not None
    gen = torch.Generator().manual_seed(11)
    for (n, k), m, with_bias in itertools.product(SHAPES, MS, (False, True)):
        x = torch.randn(m, k, generator=gen).to(x_dtype)
        wk, scale, w = _weights(n, k, torch.int8, gen)
        b = torch.randn(n, generator=gen).to(x_dtype) if with_bias else None
        y = amx.module.try_linear(x, wk, scale, b, 0, 1, True)
        _assert_close(y, x, w, b, k)


def test_amx_gemm_quantizes_x_per_row(amx: CpuKernels) -> None:
    """With the identity as weight and scale 1, y is x's per-row quantization dequantized, value
    for value: rounding half to even, an all-zero row (d = 0), rows of wide range."""
    assert amx.module is not None
    gen = torch.Generator().manual_seed(12)
    for k, m in ((64, 40), (100, 33), (257, 50)):
        x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 3, k)
        x[0] = 0.0
        x[1, :3] = torch.tensor([127.0, 63.5, -0.5])  # d = 1: 63.5 -> 64, -0.5 -> -0 (even)
        x[1, 3:] = 0.0
        eye, one = torch.eye(k, dtype=torch.int8), torch.ones(k)
        y = amx.module.try_linear(x, eye, one, None, 0, 1, True)
        assert torch.equal(y, q8_reference(x, k)), (k, m)
        assert y[1, :3].tolist() == [127.0, 64.0, 0.0]


def test_amx_gemm_layouts_and_threads(amx: CpuKernels) -> None:
    """Strided and 3-D x, a weight that is a row slice of a larger one, and a result that does
    not depend on the thread count (each output's sum is one tile chain in one order)."""
    assert amx.module is not None
    gen = torch.Generator().manual_seed(13)
    big, scale_all, w_all = _weights(200, 320, torch.int8, gen)
    wk, scale, w = big[40:140], scale_all[40:140], w_all[40:140]
    for x in (
        torch.randn(90, 400, generator=gen)[:, 40:360],  # row stride 400
        torch.randn(2, 45, 320, generator=gen).to(torch.bfloat16),  # 3-D, M = 90
    ):
        y = amx.module.try_linear(x, wk, scale, None, 0, 1, True)
        assert y.shape == (*x.shape[:-1], 100)
        _assert_close(y, x, w, None, 320)
    x = torch.randn(150, 320, generator=gen).to(torch.bfloat16)
    one, many = on_one_and_many_threads(
        lambda: amx.module.try_linear(x, wk, scale, None, 0, 1, True)
    )
    assert torch.equal(one, many)


def test_linear_routes_int8_to_amx_and_bf16_to_torch(amx: CpuKernels) -> None:
    """``CpuKernels.linear`` on the amx variant: int8 weights on the skinny GEMM up to
    ``int8_max_m`` rows and on the AMX tiles beyond (``TORCH_Q8`` with the same routing is the
    reference of both), bf16 weights to torch's GEMM beyond ``bf16_max_m``."""
    from dataclasses import replace

    import torch.nn.functional as F

    assert amx.module is not None
    reference = replace(TORCH_Q8, int8_max_m=amx.int8_max_m, amx_int8=True)
    gen = torch.Generator().manual_seed(14)
    wf = torch.randn(96, 256, generator=gen) * 0.05
    q, scale = quantize_int8(wf)
    for m in (1, amx.int8_max_m, amx.int8_max_m + 1, MAX_M + 5):
        x = torch.randn(m, 256, generator=gen).to(torch.bfloat16)
        block = 32 if m <= amx.int8_max_m else 256
        _assert_close(amx.linear(x, q, None, scale), x, q.float() * scale[:, None], None, block)
        want = reference.linear(x, q, None, scale)
        got = amx.linear(x, q, None, scale)
        assert (got.float() - want.float()).abs().max() <= 2.0**-7 * want.float().abs().max()
    wb = wf.to(torch.bfloat16)
    x = torch.randn(amx.bf16_max_m + 1, 256, generator=gen).to(torch.bfloat16)
    assert torch.equal(amx.linear(x, wb), F.linear(x, wb))
