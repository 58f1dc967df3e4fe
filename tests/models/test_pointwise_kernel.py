"""The pointwise kernels of every ISA variant (``pointwise.cpp``) against their torch references.

RoPE and the KV store match bit for bit (the kernel rounds where torch rounds). SiLU-and-mul
uses its own exp (Cephes) where torch uses Sleef's, and Qwen3's q/k norms sum their squares in
another order than torch's: fp32 results agree to a few ulp, bf16 ones are equal but for the
rare value at a rounding boundary (one bf16 ulp).
"""

from __future__ import annotations

import pytest
import torch

from radixserve.memory_pool import KVCache
from radixserve.models.kernels import TORCH_ONLY, CpuKernels
from radixserve.models.kernels.pointwise import apply_rotary, silu_mul, split_rope

DTYPES = [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("shape", [(1, 2 * 4864), (3, 2 * 40), (5, 2 * 17), (2, 2)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_matches_torch(
    variant_kernels: CpuKernels, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(shape[1])
    gate_up = (torch.randn(shape, generator=gen) * 4).to(dtype)
    gate_up[0, 0] = -100.0  # exp(-x) overflows in torch's formula
    gate_up[0, 1 % (shape[1] // 2)] = 90.0
    assert variant_kernels.module is not None
    out = variant_kernels.module.try_silu_mul(gate_up)  # the kernel route itself
    assert out is not None
    ref = silu_mul(gate_up)
    assert out.shape == ref.shape and out.dtype == dtype
    if dtype == torch.bfloat16:
        close = torch.isclose(out.float(), ref.float(), rtol=2**-7, atol=1e-30)
        assert bool(close.all())
        assert (out != ref).sum().item() <= max(2, out.numel() // 100)
    else:
        torch.testing.assert_close(out, ref, rtol=4e-7, atol=1e-30)


def _rotary_case(
    dtype: torch.dtype, tokens: int, heads: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv-like rows (heads, then 3 spare heads) and cos/sin tables of random positions."""
    gen = torch.Generator().manual_seed(d * heads + tokens)
    rows = torch.randn(tokens, (heads + 3) * d, generator=gen).to(dtype)
    angles = torch.rand(tokens, 1, d, generator=gen) * 100
    cos = angles.cos().to(dtype)
    sin = angles.sin().to(dtype)
    sin[..., : d // 2] *= -1
    return rows, cos, sin


@pytest.mark.parametrize("tokens,heads,d", [(1, 18, 64), (7, 5, 128), (3, 2, 40), (2, 3, 6)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_matches_torch_bit_for_bit(
    variant_kernels: CpuKernels, tokens: int, heads: int, d: int, dtype: torch.dtype
) -> None:
    rows, cos, sin = _rotary_case(dtype, tokens, heads, d)
    before = rows.clone()
    x = rows[:, : heads * d].view(tokens, heads, d)  # strided rows, as in the decoder
    ref = apply_rotary(x, cos, sin)
    out = variant_kernels.rotary(x, cos, sin)
    assert out.data_ptr() == x.data_ptr(), "the kernel route rotates in place"
    assert torch.equal(out, ref)
    assert torch.equal(rows[:, heads * d :], before[:, heads * d :])  # the other columns


def test_rotary_falls_back_for_what_it_cannot_take(variant_kernels: CpuKernels) -> None:
    rows, cos, sin = _rotary_case(torch.bfloat16, 3, 4, 32)
    x = rows[:, : 4 * 32].view(3, 4, 32)
    for c, s in (
        (cos.float(), sin.float()),
        (cos.repeat(1, 1, 2)[..., ::2], sin.repeat(1, 1, 2)[..., ::2]),
    ):
        before = x.clone()
        out = variant_kernels.rotary(x, c, s)
        assert torch.equal(x, before) and torch.equal(out, apply_rotary(x, c, s))
    assert torch.equal(TORCH_ONLY.rotary(x, cos, sin), apply_rotary(x, cos, sin))


SPLIT_SHAPES = [(14, 2, 64), (4, 4, 128), (3, 1, 40)]


def _split_case(
    dtype: torch.dtype, heads: int, kv_heads: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cos, sin = _rotary_case(dtype, 3, heads + 2 * kv_heads - 3, d)
    return rows[1:], cos[1:], sin[1:]  # qkv with a storage offset


@pytest.mark.parametrize("heads,kv_heads,d", SPLIT_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_rope_matches_torch_bit_for_bit(
    variant_kernels: CpuKernels, heads: int, kv_heads: int, d: int, dtype: torch.dtype
) -> None:
    qkv, cos, sin = _split_case(dtype, heads, kv_heads, d)
    ref = split_rope(qkv.clone(), heads, kv_heads, cos, sin)
    ours = variant_kernels.split_rope(qkv, heads, kv_heads, cos, sin)
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    assert ours[0].data_ptr() == qkv.data_ptr()  # views of qkv, rotated in place
    assert ours[2].data_ptr() == qkv[:, (heads + kv_heads) * d :].data_ptr()


@pytest.mark.parametrize("heads,kv_heads,d", SPLIT_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_rope_with_qk_norms_matches_torch(
    variant_kernels: CpuKernels, heads: int, kv_heads: int, d: int, dtype: torch.dtype
) -> None:
    """Qwen3's q/k norms in the kernel (``norm_head``), before the rotation: its fp32 sum of
    squares runs in another order than torch's, so fp32 results agree to a few ulp and bf16 ones
    are equal but for the rare value at a rounding boundary (one bf16 ulp)."""
    qkv, cos, sin = _split_case(dtype, heads, kv_heads, d)
    qkv[0, :d] *= 1e-3  # a head of tiny values: eps matters
    gen = torch.Generator().manual_seed(1)
    norm = (torch.rand(heads + kv_heads, d, generator=gen).to(dtype), 1e-6)
    ref = split_rope(qkv.clone(), heads, kv_heads, cos, sin, norm)
    ours = variant_kernels.split_rope(qkv, heads, kv_heads, cos, sin, norm)
    assert ours[0].data_ptr() == qkv.data_ptr(), "the kernel route normed and rotated in place"
    assert torch.equal(ours[2], ref[2])  # v untouched
    for a, b in zip(ours[:2], ref[:2], strict=True):
        assert a.shape == b.shape
        if dtype == torch.bfloat16:
            assert bool(torch.isclose(a.float(), b.float(), rtol=2**-7, atol=2**-14).all())
            assert (a != b).sum().item() <= max(2, a.numel() // 100)
        else:
            torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)


def test_split_rope_declines_a_qk_norm_weight_it_cannot_take(variant_kernels: CpuKernels) -> None:
    """A q/k norm weight of another dtype or shape leaves qkv untouched: None, and the caller
    runs the torch path."""
    qkv, cos, sin = _split_case(torch.bfloat16, 4, 2, 32)
    assert variant_kernels.module is not None
    for w in (torch.ones(6, 32), torch.ones(5, 32, dtype=torch.bfloat16)):
        before = qkv.clone()
        assert variant_kernels.module.try_split_rope_(qkv, 4, 2, cos, sin, w, 1e-6) is None
        assert torch.equal(qkv, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_store_kv_matches_set_kv(variant_kernels: CpuKernels, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    ours, ref = (KVCache(2, 40, 2, 64, dtype) for _ in range(2))
    qkv = torch.randn(5, 6 * 64, generator=gen).to(dtype)
    k, v = qkv[:, 2 * 64 : 4 * 64].view(5, 2, 64), qkv[:, 4 * 64 :].view(5, 2, 64)
    slots = torch.tensor([3, 39, 0, 17, 3])  # a repeated slot: the last write wins
    assert variant_kernels.module is not None
    k_buf, v_buf = ours.get_kv(1)
    assert variant_kernels.module.try_store_kv(k_buf, v_buf, slots, k, v)
    ref.set_kv(1, slots, k, v)
    for layer in range(2):
        for a, b in zip(ours.get_kv(layer), ref.get_kv(layer), strict=True):
            assert torch.equal(a, b)


def test_store_kv_falls_back_for_what_it_cannot_take(variant_kernels: CpuKernels) -> None:
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 2, 8, generator=gen), torch.randn(2, 2, 8, generator=gen)
    assert variant_kernels.module is not None
    cache = KVCache(1, 10, 2, 8, torch.bfloat16)
    k_buf, v_buf = cache.get_kv(0)
    for slots in (
        torch.tensor([1, 10]),
        torch.tensor([1, -1]),
        torch.tensor([1, 2], dtype=torch.int32),
    ):
        assert not variant_kernels.module.try_store_kv(
            k_buf, v_buf, slots, k.bfloat16(), v.bfloat16()
        )
    assert not k_buf.any() and not v_buf.any()  # nothing written
    assert not variant_kernels.module.try_store_kv(k_buf, v_buf, torch.tensor([1, 2]), k, v)
    ref = KVCache(1, 10, 2, 8, torch.bfloat16)
    variant_kernels.store_kv(cache, 0, torch.tensor([1, -1]), k, v)  # fp32 into bf16, wrapped
    ref.set_kv(0, torch.tensor([1, -1]), k, v)
    assert torch.equal(cache.get_kv(0)[0], ref.get_kv(0)[0])
    assert torch.equal(cache.get_kv(0)[1], ref.get_kv(0)[1])
