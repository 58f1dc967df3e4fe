"""The int8 GEMMs that quantize ``x`` per row against torch: on AMX tiles (``amx_gemm.cpp``,
the ``amx`` variant), with AVX-512 VNNI (``gemm_q8.h``, the ``avx512_vnni`` and ``avx512_bf16``
variants) and the packed GEMM's int16 pairs (``gemm.h``, the ``avx2``
variant, whose routing uses it).

Reference: F.linear in float32 of ``x`` quantized per row (``q8_reference(x, K)``, the same fp32
operations as the kernels' quantization) times the dequantized weight. The kernels' int32 sums
over all of K are exact; one fp32 scaling and one rounding to x's dtype follow, so the tolerance
is ``test_kernels``' (half a bf16 ulp, fp32 summation noise). Each case needs its CPU: AMX-INT8
and AMX-BF16 (Sapphire Rapids or later) for ``amx``, AVX-512 VNNI for the others; elsewhere it
is skipped, naming the variant and the instructions it lacks (the ``avx2`` variant runs on every
x86 CPU of the project).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_kernels import _assert_close, _weights, on_one_and_many_threads

from radixserve.models.kernels import MAX_M, TORCH_Q8, CpuKernels, _ext, q8_reference, quantize_int8

# (variant, the int8 GEMM its extension must report): the AMX tiles, VPDPBUSD (avx512_bf16,
# avx512_vnni), VPMADDWD pairs (avx2)
GEMMS = [("amx", "amx"), ("avx512_bf16", "vnni"), ("avx512_vnni", "vnni"), ("avx2", "packed")]


@pytest.fixture(scope="module", params=GEMMS, ids=[f"{v}-{g}" for v, g in GEMMS])
def kernels(request: pytest.FixtureRequest) -> CpuKernels:
    variant, gemm = request.param
    if not _ext.can_execute(variant):
        pytest.skip(f"this CPU cannot execute the {variant} kernel variant")
    built = CpuKernels.build(variant)
    assert built.variant == variant, f"the {variant} variant failed to build (see _ext's log)"
    assert built.module is not None and built.module.int8_gemm() == gemm
    assert built.int8_rows
    return built


# N: whole 32-row blocks, a 16-row block, ragged; K: whole 64-byte blocks and tails (the padded
# copy of the weight rows; VNNI's partial last group of 4), one large enough to chunk the rows of
# x; M: one 16-row block (VNNI's 12 x 1 tiles; below 16 rows, up to 15, their sums' padding lane
# gives the weight rows' offsets), ragged 16-row tiles, tall (max_m = 0 below: the GEMM at every
# M, even where linear() keeps the skinny GEMM).
SHAPES = [(32, 64), (48, 128), (7, 5), (37, 33), (129, 256), (301, 2100), (64, 4864), (9, 4098)]
MS = [2, 5, 8, 15, 16, 33, 40, 64, 100, 129, 300]


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gemm_matches_reference(kernels: CpuKernels, x_dtype: torch.dtype) -> None:
    assert kernels.module is not None
    gen = torch.Generator().manual_seed(11)
    for (n, k), m, with_bias in itertools.product(SHAPES, MS, (False, True)):
        x = torch.randn(m, k, generator=gen).to(x_dtype)
        wk, scale, w = _weights(n, k, torch.int8, gen)
        b = torch.randn(n, generator=gen).to(x_dtype) if with_bias else None
        y = kernels.module.try_linear(x, wk, scale, b, 0, 1, True)
        _assert_close(y, x, w, b, k)


def test_gemm_quantizes_x_per_row(kernels: CpuKernels) -> None:
    """With the identity as weight and scale 1, y is x's per-row quantization dequantized, value
    for value: rounding half to even, an all-zero row (d = 0), rows of wide range; in the tiles
    of 8 rows or fewer and of 9-15 (the weights' offsets summed on the way, or from padding)."""
    assert kernels.module is not None
    gen = torch.Generator().manual_seed(12)
    for k, m in ((64, 40), (100, 33), (257, 50), (64, 8), (257, 5), (100, 12)):
        x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 3, k)
        x[0] = 0.0
        x[1, :3] = torch.tensor([127.0, 63.5, -0.5])  # d = 1: 63.5 -> 64, -0.5 -> -0 (even)
        x[1, 3:] = 0.0
        eye, one = torch.eye(k, dtype=torch.int8), torch.ones(k)
        y = kernels.module.try_linear(x, eye, one, None, 0, 1, True)
        assert torch.equal(y, q8_reference(x, k)), (k, m)
        assert y[1, :3].tolist() == [127.0, 64.0, 0.0]


def test_gemm_layouts_and_threads(kernels: CpuKernels) -> None:
    """Strided and 3-D x, a weight that is a row slice of a larger one, and a result that does
    not depend on the thread count (each output's sum is one tile chain in one order)."""
    assert kernels.module is not None
    gen = torch.Generator().manual_seed(13)
    big, scale_all, w_all = _weights(200, 320, torch.int8, gen)
    wk, scale, w = big[40:140], scale_all[40:140], w_all[40:140]
    for x in (
        torch.randn(90, 400, generator=gen)[:, 40:360],  # row stride 400
        torch.randn(2, 45, 320, generator=gen).to(torch.bfloat16),  # 3-D, M = 90
    ):
        y = kernels.module.try_linear(x, wk, scale, None, 0, 1, True)
        assert y.shape == (*x.shape[:-1], 100)
        _assert_close(y, x, w, None, 320)
    x = torch.randn(150, 320, generator=gen).to(torch.bfloat16)
    one, many = on_one_and_many_threads(
        lambda: kernels.module.try_linear(x, wk, scale, None, 0, 1, True)
    )
    assert torch.equal(one, many)


def test_linear_routes_int8_by_rows(kernels: CpuKernels) -> None:
    """``CpuKernels.linear``: int8 weights on the skinny GEMM up to ``int8_max_m`` rows (x in
    Q8_0 blocks at batch 1, per row above) and on the per-row GEMM beyond (``TORCH_Q8`` with the
    same routing is the reference of both), bf16
    weights to torch's GEMM beyond ``bf16_max_m`` (where that is below ``MAX_M``)."""
    from dataclasses import replace

    import torch.nn.functional as F

    assert kernels.module is not None
    reference = replace(TORCH_Q8, int8_max_m=kernels.int8_max_m, int8_rows=True)
    gen = torch.Generator().manual_seed(14)
    wf = torch.randn(96, 256, generator=gen) * 0.05
    q, scale = quantize_int8(wf)
    for m in (1, kernels.int8_max_m, kernels.int8_max_m + 1, MAX_M + 5):
        x = torch.randn(m, 256, generator=gen).to(torch.bfloat16)
        block = 32 if m == 1 else 256  # batch 1: Q8_0 blocks; more rows: per row
        _assert_close(kernels.linear(x, q, None, scale), x, q.float() * scale[:, None], None, block)
        want = reference.linear(x, q, None, scale)
        got = kernels.linear(x, q, None, scale)
        assert (got.float() - want.float()).abs().max() <= 2.0**-7 * want.float().abs().max()
    if kernels.bf16_max_m < MAX_M and not kernels.gemm:
        wb = wf.to(torch.bfloat16)
        x = torch.randn(kernels.bf16_max_m + 1, 256, generator=gen).to(torch.bfloat16)
        assert torch.equal(kernels.linear(x, wb), F.linear(x, wb))


def test_k_past_the_int32_bound_goes_to_the_packed_gemm(kernels: CpuKernels) -> None:
    """Past 65,536 values of K the VNNI GEMM's int32 sums (of x offset by 128) could overflow:
    such a product goes to the packed GEMM, x quantized per row there too (its int32 sums end
    every 16,384 values of K)."""
    if kernels.module is None or kernels.module.int8_gemm() != "vnni":
        pytest.skip("the AMX GEMM sums q * w without an offset: no such bound")
    gen = torch.Generator().manual_seed(15)
    wk, scale, w = _weights(3, 65540, torch.int8, gen)
    x = torch.randn(6, 65540, generator=gen)
    _assert_close(kernels.module.try_linear(x, wk, scale, None, 0, 1, True), x, w, None, 65540)
