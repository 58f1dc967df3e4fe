"""radixserve.models.kernels.linear: the AVX-512 skinny-GEMM route against F.linear.

Reference: F.linear on the same values in float32 (exact products, fp32 sums). The kernel also
accumulates in fp32 and rounds once, so for bf16 outputs the error is at most half a bf16 ulp of
the result (2^-8 relative) plus fp32 summation-order noise; for fp32 only the summation order
differs. Tolerance: |y - ref| <= rtol * |ref| + 1e-5 * (|x| @ |w|.T + |b|), rtol = 2^-8 for bf16
and 1e-6 for fp32 (the second term bounds reordering error; a wrong element is off by O(|ref|)).
"""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
import torch.nn.functional as F

from radixserve.models import kernels
from radixserve.models.kernels import _ext

lin_mod = importlib.import_module("radixserve.models.kernels.linear")

RTOL = {torch.bfloat16: 2.0**-8, torch.float32: 1e-6}


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    bf = None if b is None else b.float()
    return F.linear(x.float(), w.float(), bf)


def _assert_close(
    y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> None:
    ref = _reference(x, w, b)
    scale = F.linear(x.float().abs(), w.float().abs(), None if b is None else b.float().abs())
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = (y.float() - ref).abs()
    bound = RTOL[x.dtype] * ref.abs() + 1e-5 * scale + 1e-30
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"max err/bound {worst:.3f} (max abs err {err.max().item():.3g})"


def _needs(dtype: torch.dtype) -> None:
    if not kernels.is_available(dtype):
        pytest.skip(f"no AVX-512 skinny kernel for {dtype} on this machine/toolchain")


@pytest.fixture(autouse=True)
def _restore_switches():
    yield
    kernels.set_enabled(True)


# K values: < 32, odd, not a multiple of 32, multiple of 32, and large (x rows leave L1 -> 4x4
# tiles); N values exercise the N % 4 tail rows and single-thread / multi-thread splits.
SHAPES = [(1, 1), (7, 5), (13, 31), (37, 33), (64, 100), (129, 256), (33, 1000), (301, 2100)]
MS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 20]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_skinny_matches_reference(dtype: torch.dtype) -> None:
    _needs(dtype)
    gen = torch.Generator().manual_seed(0)
    for (n, k), m, with_bias in itertools.product(SHAPES, MS, (False, True)):
        x = torch.randn(m, k, generator=gen).to(dtype)
        w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype) if with_bias else None
        y = kernels.skinny_linear(x, w, b)  # the kernel itself, any M
        _assert_close(y, x, w, b)
        _assert_close(kernels.linear(x, w, b), x, w, b)  # the dispatching entry point


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layouts_3d_views_and_strides(dtype: torch.dtype) -> None:
    """Views the kernel takes without copying, and the ones it leaves to F.linear (bit-exact)."""
    _needs(dtype)
    assert kernels.warmup()
    gen = torch.Generator().manual_seed(1)
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
    biases = [(None, True), (b[:70], True), (b[::2], False)]  # strided bias: F.linear
    for (x, x_ok), (bias, b_ok) in itertools.product(cases, biases):
        mask = _ext.dtype_mask(frozenset({dtype}))
        taken = lin_mod._impl(x, w, bias, kernels.MAX_M, mask, 1) is not None
        assert taken == (x_ok and b_ok), (x.shape, x.stride(), bias is None)
        y = kernels.linear(x, w, bias)
        if taken:
            _assert_close(y, x, w, bias)
        else:
            assert torch.equal(y, F.linear(x, w, bias))


def test_fallbacks_are_exactly_f_linear() -> None:
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    big = torch.randn(kernels.MAX_M + 1, 64, generator=gen).to(torch.bfloat16)
    assert torch.equal(kernels.linear(big, w), F.linear(big, w))  # M > MAX_M
    w16, x16 = w.half(), x.half()
    assert torch.equal(kernels.linear(x16, w16), F.linear(x16, w16))  # fp16
    wt = torch.randn(64, 48, generator=gen).to(torch.bfloat16).t()  # column-major weight
    assert torch.equal(kernels.linear(x, wt), F.linear(x, wt))
    with pytest.raises(RuntimeError):
        kernels.linear(x.float(), w)  # dtype mismatch: F.linear's own error
    empty = torch.zeros(0, 64, dtype=torch.bfloat16)
    assert kernels.linear(empty, w).shape == (0, 48)
    kernels.set_enabled(False)
    assert not kernels.is_enabled()
    assert torch.equal(kernels.linear(x, w), F.linear(x, w))
    kernels.set_enabled(True, float32=False)
    xf, wf = x.float(), w.float()
    assert torch.equal(kernels.linear(xf, wf), F.linear(xf, wf))


def test_autograd_goes_to_f_linear() -> None:
    w = torch.randn(16, 40, requires_grad=True)
    x = torch.randn(2, 40)
    y = kernels.linear(x, w)
    assert y.grad_fn is not None
    y.sum().backward()
    assert w.grad is not None and torch.allclose(w.grad, x.sum(0).expand(16, 40))
    with torch.no_grad():
        _assert_close(kernels.linear(x, w), x, w.detach(), None)


def test_threads_split_is_deterministic() -> None:
    _needs(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(1000, 896, generator=gen).to(torch.bfloat16)
    x = torch.randn(4, 896, generator=gen).to(torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.skinny_linear(x, w)
        torch.set_num_threads(max(2, before))
        many = kernels.skinny_linear(x, w)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)  # each output element is summed in one fixed order


def test_unavailable_extension_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing build (no compiler, bad source...) yields None and F.linear, never an error."""
    monkeypatch.setattr(_ext, "_state", {})
    monkeypatch.setattr(_ext, "SOURCES", (_ext.SOURCES[0].with_name("missing.cpp"),))
    assert _ext.load_extension() is None
    monkeypatch.setattr(_ext, "_state", {})
    monkeypatch.setattr(_ext, "SOURCES", (_ext.SOURCES[0].with_name("linear.py"),))  # not C++
    monkeypatch.setattr(_ext, "_build", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert _ext.load_extension() is None
    monkeypatch.setattr(lin_mod, "_loaded", False)
    monkeypatch.setattr(lin_mod, "_impl", None)
    x, w = torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(3, 8, dtype=torch.bfloat16)
    assert torch.equal(kernels.linear(x, w), F.linear(x, w))
    assert not kernels.warmup()
    monkeypatch.undo()
    lin_mod._refresh()


def test_no_avx512_cpu_means_no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ext, "_state", {})
    monkeypatch.setattr(_ext, "_flags_cache", [frozenset({"sse2", "avx2"})])
    monkeypatch.setattr(_ext, "_build", lambda: pytest.fail("must not build"))
    assert _ext.supported_dtypes() == frozenset()
    assert _ext.load_extension() is None
    monkeypatch.setattr(
        _ext, "_flags_cache", [frozenset({"avx512f", "avx512bw", "avx512vl", "fma"})]
    )
    assert _ext.supported_dtypes() == frozenset({torch.float32})  # no AVX512_BF16: fp32 only


def test_stale_torch_lock_is_removed(tmp_path) -> None:
    (tmp_path / "lock").write_text("")  # left by a builder that was killed
    with _ext._build_lock(str(tmp_path)):
        assert not (tmp_path / "lock").exists()
