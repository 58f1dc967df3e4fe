"""The skinny GEMM of every ISA variant against the float32 torch reference.

Reference: F.linear in float32 on the same stored values (int8 weights dequantized, w * scale;
with int8 weights the kernel multiplies x quantized per block of 32 at batch 1 and per row from
two rows on, so the reference takes x through the same quantization, ``q8_reference``). The
kernel accumulates in fp32 (exact int32 within a block, or over the row, for int8) and rounds
once, so bf16 outputs
are within half a bf16 ulp of the result (2^-8 relative) plus fp32 summation-order noise; fp32
outputs differ only by the summation order. Tolerance: |y - ref| <= rtol * |ref| + 1e-5 *
(|x| @ |w|.T + |b|), rtol 2^-8 for bf16 and 1e-6 for fp32 outputs (the second term bounds
reordering error; a wrong element is off by O(|ref|)).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radixserve.models.kernels import (
    MAX_M,
    Q8_BLOCK,
    TORCH_ONLY,
    TORCH_Q8,
    CpuKernels,
    _ext,
    q8_reference,
    quantize_int8,
    quantize_rows_q8,
    torch_linear,
)
from radixserve.models.kernels.cpu_kernels import (
    AMX_BF16_MAX_M,
    AMX_INT8_MAX_M,
    AVX512_BF16_MAX_M,
    GEMM_BF16_MAX_M,
    GEMM_INT8_MAX_M,
    PACKED_GEMM_VARIANTS,
    VNNI_INT8_MAX_M,
)
from radixserve.models.kernels.linear import Q8_ROW_MAX_K

RTOL = {torch.bfloat16: 2.0**-8, torch.float32: 1e-6}
W_DTYPES = [torch.float32, torch.bfloat16, torch.int8]


def _weights(
    n: int, k: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(stored weight, scale or None, the float32 values it stands for)."""
    w = torch.randn(n, k, generator=gen) * 0.05
    if dtype == torch.int8:
        q, scale = quantize_int8(w)
        return q, scale, q.float() * scale[:, None]
    return w.to(dtype), None, w.to(dtype).float()


def _assert_close(
    y: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    block: int | None = None,
) -> None:
    """``block``: a kernel's int8 route, whose x is ``q8_reference(x, block)`` (Q8_BLOCK: the
    skinny GEMM's, K: the AMX GEMM's per-row quantization)."""
    bf = None if b is None else b.float()
    xr = q8_reference(x, block) if block else x.float()
    ref = F.linear(xr, w, bf)
    scale = F.linear(xr.abs(), w.abs(), None if b is None else bf.abs())  # type: ignore[union-attr]
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = (y.float() - ref).abs()
    bound = RTOL[x.dtype] * ref.abs() + 1e-5 * scale + 1e-30
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"max err/bound {worst:.3f} (max abs err {err.max().item():.3g})"


# K values: < 8, odd, not a multiple of the vector width, multiples, and large (x rows leave L1
# -> the R x 4 tiles); N values exercise the tail rows and single/multi-thread splits.
SHAPES = [(1, 1), (7, 5), (13, 31), (37, 33), (64, 100), (129, 256), (33, 1000), (301, 2100)]
MS = [1, 2, 3, 5, 8, 9, 12, 17, MAX_M]


@pytest.mark.parametrize("w_dtype", W_DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_skinny_matches_reference(
    variant_kernels: CpuKernels, x_dtype: torch.dtype, w_dtype: torch.dtype
) -> None:
    module = variant_kernels.module
    assert module is not None
    gen = torch.Generator().manual_seed(0)
    for (n, k), m, with_bias in itertools.product(SHAPES, MS, (False, True)):
        x = torch.randn(m, k, generator=gen).to(x_dtype)
        wk, scale, w = _weights(n, k, w_dtype, gen)
        b = torch.randn(n, generator=gen).to(x_dtype) if with_bias else None
        y = module.try_linear(x, wk, scale, b, MAX_M, 1)  # the kernel itself, 1-byte tasks
        assert y is not None
        q8 = (Q8_BLOCK if m == 1 else k) if w_dtype == torch.int8 else None
        _assert_close(y, x, w, b, q8)
        routed = variant_kernels.linear(x, wk, b, scale)  # the dispatching route
        if q8 and m > variant_kernels.int8_max_m and not variant_kernels.int8_rows:
            fp32 = variant_kernels.gemm_in_fp32
            assert torch.equal(routed, torch_linear(x, wk, b, scale, fp32_compute=fp32))
        else:  # the skinny GEMM, or an int8 GEMM (x per row, as the skinny GEMM's rows)
            _assert_close(routed, x, w, b, q8)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_int8_route_quantizes_x_like_the_reference(
    variant_kernels: CpuKernels, x_dtype: torch.dtype
) -> None:
    """With the identity as int8 weight and scale 1, y is x's Q8 quantization dequantized: the
    kernel's quantization equals ``quantize_rows_q8`` value for value (fp32 y is exact; bf16 y
    rounds it once), at batch 1 in blocks of 32 (rounding half to even, zero blocks, a partial
    last block), from two rows on per row (ties, an all-zero row, a row shorter than a vector)."""
    module = variant_kernels.module
    assert module is not None
    gen = torch.Generator().manual_seed(6)
    for k, m in ((5, 1), (100, 1), (1000, 1), (5, 2), (32, 3), (100, 9), (257, 2), (1000, 17)):
        x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 3, k)
        x[0, : min(k, 40)] = 0.0  # an all-zero block (and row, where k <= 40)
        x[-1, -1] = 127.0 * 0.5  # ties: x * (1 / d) = 63.5 rounds to 64 (even)
        x[-1, -2] = -127.0
        if m > 1:  # the last row's d is 1 only when -127 is its largest magnitude
            x[-1, :-2] = x[-1, :-2].clamp(-100.0, 100.0)
        x = x.to(x_dtype)
        eye, one = torch.eye(k, dtype=torch.int8), torch.ones(k)
        y = module.try_linear(x, eye, one, None, MAX_M, 1)
        assert y is not None
        want = q8_reference(x, Q8_BLOCK if m == 1 else k)
        assert torch.equal(y, want.to(x_dtype)), (k, m)
        if m > 1:
            assert y[-1, -2:].tolist() == [-127.0, 64.0]
    q, d = quantize_rows_q8(torch.tensor([[0.5, -1.0, 0.25] + [0.0] * 30]))
    assert q[0, :3].tolist() == [64, -127, 32] and q.shape == (1, 33) and d.shape == (1, 2)


def test_int8_rows_past_the_int32_bound_keep_blocks(variant_kernels: CpuKernels) -> None:
    """Rows of x longer than ``Q8_ROW_MAX_K`` (where per-row int32 sums could overflow) keep the
    Q8_0 blocks at two rows too: one large value no longer rounds the row's small ones to 0."""
    module = variant_kernels.module
    assert module is not None
    k = Q8_ROW_MAX_K + 7
    x = torch.full((2, k), 1e-3)
    x[:, 0] = 1000.0
    ones, one = torch.ones(1, k, dtype=torch.int8), torch.ones(1)
    y = module.try_linear(x, ones, one, None, MAX_M, 1)
    assert y is not None
    want = q8_reference(x, Q8_BLOCK).sum(-1, keepdim=True)  # 1000 + (k - 1) * 1e-3
    assert torch.allclose(y, want, rtol=1e-4) and y[0, 0] > 1100.0  # fp32 sums of 131k
    assert torch.allclose(TORCH_Q8.linear(x, ones, None, one), want, rtol=1e-3)
    short = x[:, :1000].contiguous()  # within the bound: per row, the 1e-3 values round to 0
    y = module.try_linear(short, ones[:, :1000], one, None, MAX_M, 1)
    assert y is not None and torch.equal(y, q8_reference(short, 1000).sum(-1, keepdim=True))
    assert abs(y[0, 0].item() - 1000.0) < 1e-3


def test_layouts_3d_views_and_strides(variant_kernels: CpuKernels) -> None:
    """Views the kernel takes without copying, and the ones it leaves to torch (bit-exact)."""
    module = variant_kernels.module
    assert module is not None
    gen = torch.Generator().manual_seed(1)
    dtype = torch.bfloat16
    w_big = torch.randn(90, 160, generator=gen).to(dtype)
    w = w_big[5:75, :130]  # row stride 160 != K: row-sliced (e.g. fused) weights need no copy
    b = torch.randn(140, generator=gen).to(dtype)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)  # views are taken after .to()

    cases = [  # (x, the kernel takes it)
        (rand(130), True),  # 1-D x
        (rand(2, 3, 130), True),  # 3-D x, M = 6
        (rand(4, 1, 130), True),  # size-1 middle dim
        (rand(3, 300)[:, 10:140], True),  # row stride 300
        (rand(130).expand(4, 130), True),  # zero row stride
        (rand(2, 5, 3, 130)[:, 1:4, 0], False),  # leading dims do not collapse
        (rand(130, 4).t(), False),  # inner stride != 1
    ]
    biases = [(None, True), (b[:70], True), (b[::2], False)]  # strided bias: torch
    for (x, x_ok), (bias, b_ok) in itertools.product(cases, biases):
        taken = module.try_linear(x, w, None, bias, MAX_M, 1) is not None
        assert taken == (x_ok and b_ok), (x.shape, x.stride(), bias is None)
        y = variant_kernels.linear(x, w, bias)
        if taken:
            _assert_close(y, x, w.float(), bias)
        else:
            fp32 = variant_kernels.gemm_in_fp32
            assert torch.equal(y, torch_linear(x, w, bias, fp32_compute=fp32))


def test_what_the_kernel_declines_goes_to_torch(variant_kernels: CpuKernels) -> None:
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    k = variant_kernels
    big = torch.randn(MAX_M + 1, 64, generator=gen).to(torch.bfloat16)  # M > MAX_M
    ref_big = F.linear(big.float(), w.float()).to(torch.bfloat16)
    if k.gemm:  # the packed GEMM (tested below)
        assert torch.equal(
            k.linear(big, w), k.module.try_linear(big, w, None, None, MAX_M, 1, True)
        )
    else:
        assert torch.equal(k.linear(big, w), ref_big if k.gemm_in_fp32 else F.linear(big, w))
    assert torch.equal(k.linear(big.float(), w.float()), F.linear(big.float(), w.float()))
    w16, x16 = w.half(), x.half()
    assert torch.equal(k.linear(x16, w16), F.linear(x16, w16))  # fp16
    q, scale = quantize_int8(w.float())
    assert k.module is not None and k.module.try_linear(x, q, None, None, MAX_M, 1) is None
    assert k.module.try_linear(x, w, scale, None, MAX_M, 1) is None  # a scale needs int8
    empty = torch.zeros(0, 64, dtype=torch.bfloat16)
    assert k.linear(empty, w).shape == (0, 48)
    with torch.enable_grad():  # autograd goes to torch
        wg = torch.randn(16, 40, requires_grad=True)
        y = k.linear(torch.randn(2, 40), wg)
        assert y.grad_fn is not None


def test_torch_only_is_the_reference() -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    assert torch.equal(TORCH_ONLY.linear(x, w), F.linear(x, w))
    q, scale = quantize_int8(w)
    want = (F.linear(x, q.to(torch.bfloat16)).float() * scale).to(torch.bfloat16)
    assert torch.equal(TORCH_ONLY.linear(x, q, None, scale), want)  # the scales on the output
    exact = F.linear(x.float(), q.float() * scale[:, None])
    err = (TORCH_ONLY.linear(x.float(), q, None, scale) - exact).abs()
    assert err.max() <= 1e-5 * exact.abs().max()
    err = (q.float() * scale[:, None] - w.float()).abs()
    assert (err <= scale[:, None] / 2 + 1e-7).all()  # round to nearest, per-channel scale


def on_one_and_many_threads(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn()`` on 1 intra-op thread, then on at least 2 (torch's count restored after)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fn()
        torch.set_num_threads(max(2, before))
        return one, fn()
    finally:
        torch.set_num_threads(before)


def test_threads_split_is_deterministic(variant_kernels: CpuKernels) -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(1000, 896, generator=gen).to(torch.bfloat16)
    x = torch.randn(4, 896, generator=gen).to(torch.bfloat16)
    one, many = on_one_and_many_threads(lambda: variant_kernels.linear(x, w))
    assert torch.equal(one, many)  # each output element is summed in one fixed order


# (N, K): N around the tile width (16 columns on AVX2, 32 with AVX-512), K from 1 to more than
# one pass (gemm.cpp KC = 8192); M: just past MAX_M, a partial last tile, past one round of rows
# (MB = 1024).
GEMM_SHAPES = [(1, 1), (16, 7), (33, 100), (70, 257), (301, 896)]
GEMM_MS = [MAX_M + 1, 150, 1031]


@pytest.mark.parametrize("w_dtype", W_DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_packed_gemm_matches_reference(
    variant_kernels: CpuKernels, x_dtype: torch.dtype, w_dtype: torch.dtype
) -> None:
    """gemm.cpp (more rows than the skinny GEMM takes) against F.linear in float32 on the same
    stored values; x is not quantized there for fp32 and bf16 weights, and quantized per row for
    int8 weights (which the kernels take to amx_gemm.cpp or gemm_q8.h where the CPU has AMX or
    AVX-512 VNNI, to gemm.h's int16 pairs elsewhere)."""
    module = variant_kernels.module
    assert module is not None
    gen = torch.Generator().manual_seed(7)
    cases = [*itertools.product(GEMM_SHAPES, GEMM_MS[:2]), ((40, 8200), 131), ((20, 64), 1031)]
    for ((n, k), m), with_bias in itertools.product(cases, (False, True)):
        x = torch.randn(m, k, generator=gen).to(x_dtype)
        wk, scale, w = _weights(n, k, w_dtype, gen)
        b = torch.randn(n, generator=gen).to(x_dtype) if with_bias else None
        y = module.try_linear(x, wk, scale, b, MAX_M, 1, True)
        assert y is not None
        _assert_close(y, x, w, b, k if w_dtype == torch.int8 else None)
        assert module.try_linear(x, wk, scale, b, MAX_M, 1) is None  # without gemm: torch's


def test_packed_gemm_layouts_routing_and_threads(variant_kernels: CpuKernels) -> None:
    """Strided and 3-D x, the route CpuKernels.linear takes (bf16 and int8 weights on CPUs
    without native bf16; fp32 weights stay with torch), and a result independent of the thread
    count (each output element is summed by one tile in one order)."""
    k = variant_kernels
    assert k.module is not None
    gen = torch.Generator().manual_seed(8)
    w = (torch.randn(90, 300, generator=gen) * 0.05).to(torch.bfloat16)
    for x in (
        torch.randn(140, 400, generator=gen)[:, 50:350],  # row stride 400
        torch.randn(2, 70, 300, generator=gen),  # 3-D, M = 140
    ):
        y = k.module.try_linear(x, w, None, None, MAX_M, 1, True)
        _assert_close(y, x, w.float(), None)
    x = torch.randn(MAX_M + 20, 300, generator=gen).to(torch.bfloat16)
    want = k.module.try_linear(x, w, None, None, MAX_M, 1, True) if k.gemm else None
    assert k.gemm == (k.variant in PACKED_GEMM_VARIANTS)  # avx2: no native bf16 in its CPUs
    if want is not None:
        assert torch.equal(k.linear(x, w), want)
    if k.int8_rows:  # int8 past int8_max_m rows: the kernels' packed, VNNI or AMX GEMM
        q, scale = quantize_int8(w.float())
        assert torch.equal(
            k.linear(x, q, None, scale), k.module.try_linear(x, q, scale, None, MAX_M, 1, True)
        )
    x32 = x.float()
    assert torch.equal(k.linear(x32, w.float()), F.linear(x32, w.float()))
    one, many = on_one_and_many_threads(
        lambda: k.module.try_linear(x, w, None, None, MAX_M, 1, True)
    )
    assert torch.equal(one, many)


def test_variant_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ext.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset({"sse2", "avx2", "fma", "f16c"})])
    assert _ext.best_variant() == "avx2"
    assert not _ext.can_execute("avx512")
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"}
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset(avx512)])
    assert _ext.best_variant() == "avx512"
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset(avx512 | {"avx512_vnni"})])
    assert _ext.best_variant() == "avx512_vnni"  # Cascade Lake, Ice Lake
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset(avx512 | {"avx512_bf16"})])
    assert _ext.best_variant() == "avx512"  # its build also uses VNNI
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset(avx512 | {"avx512_bf16", "avx512_vnni"})])
    assert _ext.best_variant() == "avx512_bf16"
    assert _ext.best_variant("avx512_vnni") == "avx512_vnni"
    assert _ext.best_variant("avx2") == "avx2"  # RADIXSERVE_CPU_ISA=avx2 forces the lower one
    amx = avx512 | {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"}
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset(amx)])
    assert _ext.best_variant() == "amx" and _ext.best_variant("avx512_bf16") == "avx512_bf16"
    with pytest.raises(ValueError, match="unknown CPU kernel variant"):
        _ext.best_variant("sse9")
    assert not _ext.can_execute("neon")  # an x86 CPU never runs the aarch64 build
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset({"sse2"})])
    assert _ext.best_variant() is None
    monkeypatch.setattr(_ext.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset({"fp", "asimd", "crc32"})])
    assert _ext.best_variant() == "neon" and not _ext.can_execute("avx2")
    assert CpuKernels.build() is TORCH_ONLY  # nothing to build on such a CPU


def test_routing_follows_the_variant_not_the_cpu() -> None:
    """Each variant routes as a CPU of that variant would, whatever this CPU has: so
    ``RADIXSERVE_CPU_ISA=avx2`` on an AMX Xeon routes as an AVX2 CPU (packed GEMM, fp32 GEMMs)."""
    avx2 = CpuKernels.routing("avx2")
    assert avx2.gemm and avx2.gemm_in_fp32 and avx2.int8_rows  # int8: the packed GEMM, x per row
    assert (avx2.bf16_max_m, avx2.int8_max_m) == (GEMM_BF16_MAX_M, GEMM_INT8_MAX_M)
    for name in ("avx512", "neon"):  # avx512 as on Skylake-X: no VNNI
        k = CpuKernels.routing(name)
        assert not k.gemm and not k.int8_rows and k.gemm_in_fp32
        assert (k.bf16_max_m, k.int8_max_m) == (MAX_M, MAX_M)
    # AVX-512 with VNNI (avx512_vnni, avx512_bf16): int8 past VNNI_INT8_MAX_M rows on the VNNI
    # GEMM, x quantized per row
    for k in (CpuKernels.routing("avx512_bf16"), CpuKernels.routing("avx512_vnni")):
        assert k.int8_rows and not k.gemm
        assert k.gemm_in_fp32 == (k.variant == "avx512_vnni")
        bf16_max_m = MAX_M if k.gemm_in_fp32 else AVX512_BF16_MAX_M  # native: torch's bf16 GEMM
        assert (k.bf16_max_m, k.int8_max_m) == (bf16_max_m, VNNI_INT8_MAX_M)
    amx = CpuKernels.routing("amx")
    assert amx.int8_rows and not amx.gemm and not amx.gemm_in_fp32
    assert (amx.bf16_max_m, amx.int8_max_m) == (AMX_BF16_MAX_M, AMX_INT8_MAX_M) < (MAX_M, MAX_M)
    assert CpuKernels.routing("amx", "vnni").int8_max_m == VNNI_INT8_MAX_M  # AMX not granted
    assert CpuKernels.routing("amx").module is None  # the decision alone, nothing built


def test_unavailable_extension_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing build (no compiler, bad source...) yields the torch paths, never an error."""
    variant = _ext.best_variant()
    if variant is None:
        pytest.skip("this CPU runs no kernel variant")
    monkeypatch.setattr(_ext, "_modules", {})
    monkeypatch.setattr(_ext, "SOURCES", (_ext.SOURCES[0].with_name("missing.cpp"),))
    assert _ext.load_variant(variant) is None
    monkeypatch.setattr(_ext, "_modules", {})
    monkeypatch.setattr(_ext, "SOURCES", (_ext.SOURCES[0].with_name("linear.py"),))  # not C++
    monkeypatch.setattr(_ext, "_build", lambda v: (_ for _ in ()).throw(RuntimeError("boom")))
    assert _ext.load_variant(variant) is None
    assert CpuKernels.build() is TORCH_ONLY


def test_stale_torch_lock_is_removed(tmp_path) -> None:
    (tmp_path / "lock").write_text("")  # left by a builder that was killed
    with _ext._build_lock(str(tmp_path)):
        assert not (tmp_path / "lock").exists()


def test_the_unity_build_includes_every_source_once_and_keeps_its_files(tmp_path) -> None:
    """Each source in exactly one unit; a second build over the same directory rewrites no
    unit (ninja would rebuild a unit whose file is newer than its object)."""
    paths = [Path(p) for p in _ext._unit_files(str(tmp_path))]
    included = [
        Path(line.split('"')[1])
        for p in paths
        for line in p.read_text().splitlines()
        if line.startswith("#include")
    ]
    assert sorted(included) == sorted(s.resolve() for s in _ext.SOURCES)
    assert len(set(included)) == len(included) and len(paths) == len(_ext.UNITS) == 2
    stamps = [p.stat().st_mtime_ns for p in paths]
    time.sleep(0.01)
    assert _ext._unit_files(str(tmp_path)) == [str(p) for p in paths]
    assert [p.stat().st_mtime_ns for p in paths] == stamps
