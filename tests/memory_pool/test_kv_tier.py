"""KVTier: pool -> tier -> pool copies, its allocator, and a file tier across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.memory_pool.kv_cache import KVCache
from radixserve.memory_pool.kv_tier import TierLayout, file_tier, host_tier


def _pool(dtype: torch.dtype = torch.float32, num_slots: int = 64) -> KVCache:
    kv = KVCache(num_layers=3, num_slots=num_slots, num_kv_heads=2, head_dim=4, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    for layer in range(kv.num_layers):
        k, v = kv.get_kv(layer)
        k.copy_(torch.randn(k.shape, generator=gen).to(dtype))
        v.copy_(torch.randn(v.shape, generator=gen).to(dtype))
    return kv


def _kv_at(kv: KVCache, slots: torch.Tensor) -> list[torch.Tensor]:
    return [t[slots].clone() for layer in range(kv.num_layers) for t in kv.get_kv(layer)]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_then_read_moves_the_exact_bytes(page_size: int, dtype: torch.dtype) -> None:
    kv = _pool(dtype)
    tier = host_tier(TierLayout.of(kv, page_size), num_tokens=16)
    assert tier.capacity == 16 and tier.used_size() == 0
    src = torch.arange(8, 16)
    tier_slots = tier.write(kv, src)
    assert tier_slots is not None and tier.used_size() == 8
    expected = _kv_at(kv, src)
    dst = torch.arange(40, 48)
    tier.read(tier_slots, kv, dst)
    assert all(torch.equal(a, b) for a, b in zip(_kv_at(kv, dst), expected, strict=True))
    assert tier.write(kv, torch.arange(16, 32)) is None  # short: nothing written
    assert tier.used_size() == 8
    tier.check_integrity(tier_slots)
    with pytest.raises(AssertionError, match="leaked"):
        tier.check_integrity(torch.empty(0, dtype=torch.int64))
    tier.forget(tier_slots)
    tier.check_integrity(torch.empty(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="tier slots into"):
        tier.read(tier_slots[:4], kv, dst)
    with pytest.raises(ValueError, match="does not match"):
        tier.write(_pool(torch.float16), src)


def test_a_file_tier_survives_a_restart_and_refuses_another_layout(tmp_path: Path) -> None:
    kv = _pool()
    layout = TierLayout.of(kv, page_size=4)
    tier, reopened = file_tier(tmp_path, layout, num_tokens=32, model_key="tiny@abc")
    assert not reopened
    src = torch.arange(4, 12)
    held = tier.write(kv, src)
    assert held is not None
    expected = _kv_at(kv, src)
    tier.flush()
    del tier

    again, reopened = file_tier(tmp_path, layout, num_tokens=32, model_key="tiny@abc")
    assert reopened
    again.claim(held)  # the owner restores what it holds
    again.check_integrity(held)
    fresh = _pool(num_slots=64)
    again.read(held, fresh, torch.arange(20, 28))
    assert all(
        torch.equal(a, b)
        for a, b in zip(_kv_at(fresh, torch.arange(20, 28)), expected, strict=True)
    )
    other = again.write(kv, torch.arange(0, 4))
    assert other is not None and not set(other.tolist()) & set(held.tolist())
    del again

    for key, size in (("other-model", 32), ("tiny@abc", 64)):
        tier, reopened = file_tier(tmp_path, layout, num_tokens=size, model_key=key)
        assert not reopened and tier.used_size() == 0
    bf16 = TierLayout.of(_pool(torch.bfloat16), page_size=4)
    assert not file_tier(tmp_path, bf16, num_tokens=64, model_key="tiny@abc")[1]
