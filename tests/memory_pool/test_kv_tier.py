"""KVTier: pool -> tier -> pool copies, its allocator, and a file tier across a restart, with\nthe index of what the tree held (``radix.tier_index``)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_cache import KVCache
from radixserve.memory_pool.kv_tier import (
    CHECKSUMS,
    HEADER,
    INDEX,
    STORAGE,
    KVTier,
    TierLayout,
    file_tier,
    host_tier,
)
from radixserve.radix.tier_index import restore_index, save_index
from radixserve.radix.tiered_cache import TieredRadixCache

pytestmark = pytest.mark.timeout(60)


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


def _page_keys(tier: KVTier, tokens: range) -> np.ndarray | None:
    """The keys of the pages that hold ``tokens`` at the start of a sequence (a file tier)."""
    seq = tier.sequence_hash(None)
    if seq is None:
        return None
    return seq.page_keys(np.asarray(tokens, np.int32).tobytes(), tier.layout.page_size)


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
    held = tier.write(kv, src, _page_keys(tier, range(8)))
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
    other = again.write(kv, torch.arange(0, 4), _page_keys(again, range(4)))
    assert other is not None and not set(other.tolist()) & set(held.tolist())
    del again

    for key, size in (("other-model", 32), ("tiny@abc", 64)):
        tier, reopened = file_tier(tmp_path, layout, num_tokens=size, model_key=key)
        assert not reopened and tier.used_size() == 0
        tier.close()
    bf16 = TierLayout.of(_pool(torch.bfloat16), page_size=4)
    assert not file_tier(tmp_path, bf16, num_tokens=64, model_key="tiny@abc")[1]


# ---- the index of a file tier (radix.tier_index): what the tree held, across a restart -------


class Server:
    """What a server holds over a file tier: a pool, its allocator and the tiered tree."""

    def __init__(self, path: Path, ps: int, model_key: str = "tiny@abc", fresh: bool = False):
        self.kv = _pool(num_slots=64)
        if fresh:  # a restarted server's pool holds nothing of the old one's
            for layer in range(self.kv.num_layers):
                for t in self.kv.get_kv(layer):
                    t.zero_()
        self.alloc = TokenToKVPoolAllocator(64, ps)
        layout = TierLayout.of(self.kv, ps)
        self.tier, self.reopened = file_tier(path, layout, 32, model_key)
        self.tree = TieredRadixCache(ps, self.tier, self.kv)

    def cache(self, key: list[int], extra: str | None = None) -> list[torch.Tensor]:
        """Compute ``key`` (its K/V: what the pool holds at the new slots), insert it, then
        evict everything into the tier; returns the K/V it computed."""
        slots = self.alloc.alloc(len(key))
        assert slots is not None
        expected = _kv_at(self.kv, slots)
        result = self.tree.insert(key, slots, extra)
        self.alloc.free(slots[: result.num_present])
        self.alloc.free(self.tree.evict(1000))
        return expected

    def load(self, key: list[int], extra: str | None = None) -> list[torch.Tensor]:
        """Match ``key`` (all of it in the tier) and load it back; the K/V that came back."""
        match = self.tree.match_prefix(key, extra)
        assert match.indices.numel() == 0 and match.tier_len == len(key)
        self.tree.inc_lock_ref(match.last_node)
        slots = self.alloc.alloc(match.tier_len)
        assert slots is not None
        self.tree.load_back(match.last_node, slots)
        self.tree.dec_lock_ref(match.last_node)
        return _kv_at(self.kv, slots)

    def check(self) -> None:
        self.tree.check_integrity()
        self.alloc.check_integrity(self.tree.all_values())


def _keys(ps: int) -> tuple[list[int], list[int], list[int]]:
    a = list(range(1, 1 + 2 * ps))
    return a, a + list(range(50, 50 + 2 * ps)), list(range(80, 80 + 2 * ps))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("ps", [1, 4])
def test_the_index_brings_the_tier_tree_back_after_a_restart(tmp_path: Path, ps: int) -> None:
    old = Server(tmp_path, ps)
    a, ab, c = _keys(ps)
    want_ab = old.cache(ab)
    want_c = old.cache(c, "salt")
    old.tree.match_prefix(a)  # splits ab: a -> b, three nodes
    assert save_index(old.tree) == 3
    assert (tmp_path / INDEX).exists()
    del old

    new = Server(tmp_path, ps, fresh=True)
    assert new.reopened
    assert restore_index(new.tree) == len(ab) + len(c)
    assert not (tmp_path / INDEX).exists()  # the tier is written again from now on
    assert new.tree.total_size() == 0 and new.tier.used_size() == len(ab) + len(c)
    new.check()
    assert new.tree.match_prefix(c).cached_len == 0  # another extra key
    assert _same(new.load(ab), want_ab)
    assert _same(new.load(c, "salt"), want_c)
    new.check()
    # a write after the restore takes none of the restored slots
    held = set(new.tree.all_tier_values().tolist())
    slots = new.tier.write(new.kv, torch.arange(ps, 3 * ps), _page_keys(new.tier, range(2 * ps)))
    assert slots is not None and not set(slots.tolist()) & held


@pytest.mark.parametrize("ps", [1, 4])
def test_a_changed_page_drops_its_node_and_what_hangs_under_it(tmp_path: Path, ps: int) -> None:
    """A page whose bytes changed between the stop and the restart fails its checksum; its node and
    the nodes under it are not restored (their slots stay free), the others are, with their exact
    K/V."""
    old = Server(tmp_path, ps)
    a, ab, c = _keys(ps)
    old.cache(ab)
    want_c = old.cache(c)
    old.tree.match_prefix(a)  # splits ab: a -> b
    assert save_index(old.tree) == 3
    a_node = old.tree.match_prefix(a).last_node
    first_page = int(a_node.tier_value[0])  # type: ignore[index]
    del old
    new = Server(tmp_path, ps, fresh=True)
    new.tier.storage[1, 1, first_page, 0, 0] += 1.0  # one value of one page of node a
    assert restore_index(new.tree) == len(c)  # a is dropped, and b under it
    assert new.tier.num_corrupt_pages == 1 and new.tier.used_size() == len(c)
    assert new.tree.match_prefix(ab).tier_len == 0
    assert _same(new.load(c), want_c)
    new.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_a_write_after_the_save_deletes_the_stale_index(tmp_path: Path, ps: int) -> None:
    old = Server(tmp_path, ps)
    a, _, c = _keys(ps)
    old.cache(a)
    save_index(old.tree)
    old.cache(c)  # written back to the tier: slots the index says are free may hold it now
    assert not (tmp_path / INDEX).exists()
    del old
    new = Server(tmp_path, ps, fresh=True)
    assert new.reopened and restore_index(new.tree) == 0
    assert new.tree.match_prefix(a).cached_len == 0 and new.tier.used_size() == 0
    new.check()


def test_another_model_key_discards_the_tier_and_its_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = Server(tmp_path, 4)
    a, _, _ = _keys(4)
    old.cache(a)
    assert save_index(old.tree) == 1
    del old
    with caplog.at_level(logging.INFO, logger="radixserve.memory_pool.kv_tier"):
        new = Server(tmp_path, 4, model_key="tiny@other", fresh=True)
    assert not new.reopened
    assert "written for another model or layout; discarding it" in caplog.text
    assert not (tmp_path / INDEX).exists()
    assert restore_index(new.tree) == 0 and new.tree.match_prefix(a).cached_len == 0
    new.check()


def _rewrite_index(path: Path, **changes: np.ndarray) -> None:
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    arrays.update(changes)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


CORRUPTIONS = {
    "garbage": lambda p: p.write_bytes(b"not an index at all"),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "bit flipped": lambda p: p.write_bytes(_flip(p.read_bytes(), 100)),
    "no slots": lambda p: _rewrite_index(p, slots=np.zeros(0, np.int64)),
    "slot out of the tier": lambda p: _rewrite_index(p, slots=np.arange(1000, 1008)),
    "float keys": lambda p: _rewrite_index(p, keys=np.arange(8, dtype=np.float32)),
    "float parents": lambda p: _rewrite_index(p, parents=np.asarray([-1.0, 0.5])),
    "slots across pages": lambda p: _rewrite_index(p, slots=np.arange(6, 14)),
    "twin siblings": lambda p: _rewrite_index(p, keys=np.tile(np.arange(1, 5, dtype=np.int32), 2)),
    "extra not a list": lambda p: _rewrite_index(p, extra=np.asarray('{"a": 1}')),
}


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_index_is_discarded_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, corruption: str
) -> None:
    ps = 4
    old = Server(tmp_path, ps)
    old.cache([1, 2, 3, 4])
    old.cache([9, 10, 11, 12])  # two root children of one page each: 8 slots, 2 nodes
    assert save_index(old.tree) == 2
    del old
    CORRUPTIONS[corruption](tmp_path / INDEX)
    new = Server(tmp_path, ps, fresh=True)
    assert new.reopened
    with caplog.at_level(logging.WARNING, logger="radixserve.radix.tier_index"):
        assert restore_index(new.tree) == 0
    assert "index unreadable" in caplog.text and "starting empty" in caplog.text
    assert not (tmp_path / INDEX).exists()
    assert new.tree.root.children == {} and new.tier.used_size() == 0
    new.check()
    new.cache([1, 2, 3, 4])  # the tree and the tier work on
    new.check()


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_missing_or_short_storage_file_is_not_reopened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """The header and the index alone do not make a tier: with ``kv.bin`` deleted (someone
    clearing the cache) or cut short, the index would name bytes that are zeros now."""
    old = Server(tmp_path, 4)
    old.cache([1, 2, 3, 4])
    assert save_index(old.tree) == 1
    del old
    if damage == "deleted":
        (tmp_path / STORAGE).unlink()
    else:
        with open(tmp_path / STORAGE, "r+b") as f:
            f.truncate(100)
    with caplog.at_level(logging.INFO, logger="radixserve.memory_pool.kv_tier"):
        new = Server(tmp_path, 4, fresh=True)
    assert not new.reopened and "discarding" in caplog.text
    assert not (tmp_path / INDEX).exists()
    assert restore_index(new.tree) == 0 and new.tree.match_prefix([1, 2, 3, 4]).cached_len == 0
    new.check()


# ---- one owner per directory, and checksums bound to what the index says a page holds -------


def test_a_second_tier_on_one_directory_is_refused(tmp_path: Path) -> None:
    """Two servers on one directory would serve each other's KV: the second is refused with
    the directory named; once the first lets it go, the lock file left behind blocks nobody."""
    layout = TierLayout.of(_pool(), page_size=4)
    first, _ = file_tier(tmp_path, layout, num_tokens=32, model_key="tiny@abc")
    with pytest.raises(ValueError, match=f"{tmp_path}: another .* holds it"):
        file_tier(tmp_path, layout, num_tokens=32, model_key="tiny@abc")
    first.close()
    again, _ = file_tier(tmp_path, layout, num_tokens=32, model_key="tiny@abc")
    again.close()


def test_kv_copied_from_another_run_restores_nothing(tmp_path: Path) -> None:
    """``kv.bin`` and ``checksums.bin`` of another run (same model and shapes, other prompts)
    copied over a directory with an index: every page it names fails its checksum."""
    ps = 4
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    a, _, c = _keys(ps)
    for path, keys in ((mine, (a, c)), (theirs, ([k + 500 for k in a], [k + 600 for k in c]))):
        old = Server(path, ps)
        for key in keys:
            old.cache(key)
        assert save_index(old.tree) == 2
        del old
    for name in (STORAGE, CHECKSUMS):
        shutil.copy(theirs / name, mine / name)
    new = Server(mine, ps, fresh=True)
    assert new.reopened and restore_index(new.tree) == 0
    assert new.tier.num_corrupt_pages == (len(a) + len(c)) // ps
    assert new.tier.used_size() == 0 and new.tree.match_prefix(a).cached_len == 0
    new.check()


def test_a_page_whose_tokens_were_changed_in_the_index_is_refused(tmp_path: Path) -> None:
    """The index says a page holds other tokens than it was written for: that node is not
    restored (nor what hangs under it), the others are, with their exact K/V."""
    ps = 4
    old = Server(tmp_path, ps)
    a, ab, c = _keys(ps)
    old.cache(ab)
    want_c = old.cache(c)
    old.tree.match_prefix(a)  # splits ab: a -> b
    assert save_index(old.tree) == 3
    del old
    with np.load(tmp_path / INDEX) as data:
        keys = data["keys"].copy()
    keys[keys == a[-1]] = 999  # one token of a's last page
    _rewrite_index(tmp_path / INDEX, keys=keys)
    new = Server(tmp_path, ps, fresh=True)
    assert restore_index(new.tree) == len(c)
    assert new.tier.num_corrupt_pages == 3  # a's last page, and b's two: their prefix changed
    assert new.tree.match_prefix(a[:-1] + [999]).cached_len == 0
    assert _same(new.load(c), want_c)
    new.check()


def test_an_old_format_tier_is_discarded_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = Server(tmp_path, 4)
    old.cache([1, 2, 3, 4])
    assert save_index(old.tree) == 1
    del old
    header = json.loads((tmp_path / HEADER).read_text())
    for newer in ("version", "tier_id"):
        header.pop(newer, None)
    (tmp_path / HEADER).write_text(json.dumps(header))
    with caplog.at_level(logging.INFO, logger="radixserve.memory_pool.kv_tier"):
        new = Server(tmp_path, 4, fresh=True)
    assert not new.reopened and not (tmp_path / INDEX).exists()
    assert [r.getMessage() for r in caplog.records if "older format" in r.getMessage()]
    assert restore_index(new.tree) == 0 and new.tier.used_size() == 0
