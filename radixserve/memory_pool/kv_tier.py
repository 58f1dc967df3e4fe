"""KVTier: a second, larger and slower store of KV pages under the device pool (docs/kv_tier.md).

A tier is a paged pool of its own, ``storage[layer, 0 | 1 (K | V), slot, kv_head, head_dim]``,
with its own allocator. :meth:`KVTier.write` copies the K and V of some pool slots into tier
slots it allocates, :meth:`KVTier.read` copies tier slots back into pool slots: one gather and
one copy per layer and per K/V, never per token. What a tier slot holds is known to its owner
(the tiered radix tree), not to the tier.

Two stores, one class:

- :func:`host_tier`: host memory (pinned for a CUDA pool): on a GPU the classic second tier; on
  a CPU a pool that is larger than the one the attention kernels read, or compressible later.
- :func:`file_tier`: a memory-mapped file (``--kv-tier-path DIR --kv-tier-size 8GB``): the
  page cache keeps the hot part in memory, the disk holds the rest, and it survives a restart.
  One process owns a directory at a time (``memory_pool.tier_dir``: a lock for the tier's life).
  A header (``tier.json``) records the format version, the model, dtype, page size and shape,
  and a random tier id: a tier written by another model or layout, or in an older format, is
  discarded (with a log line), never read. Every page written gets a checksum in
  ``checksums.bin``: the XXH3-64 hash of its bytes (all layers, K and V) seeded with its page key
  (:class:`SequenceHash`: the tier id, the extra key and every token up to the page's end). A
  restarted server checks the pages its index names and drops those whose bytes changed, whose
  tokens or position the index gives otherwise, or which another tier wrote
  (``radix.tier_index``): a corrupted or foreign file costs recomputation, never a wrong answer.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import xxhash

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_cache import KVCache
from radixserve.memory_pool.tier_dir import TierUnavailable, lock_tier_dir

logger = logging.getLogger(__name__)

HEADER = "tier.json"
STORAGE = "kv.bin"
INDEX = "index.npz"  # what the tree held, written by ``radix.tier_index``
CHECKSUMS = "checksums.bin"  # int64 per page: the XXH3-64 hash of its bytes, keyed
FORMAT_VERSION = 2  # 2: checksums keyed by the tier id, the extra key and the tokens


@dataclass(frozen=True, slots=True)
class TierLayout:
    """What a tier's bytes mean; two tiers (or a tier and a pool) match when these are equal."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # str(torch.dtype), e.g. "torch.bfloat16"
    page_size: int

    @classmethod
    def of(cls, kv: KVCache, page_size: int) -> TierLayout:
        return cls(kv.num_layers, kv.num_kv_heads, kv.head_dim, str(kv.dtype), page_size)

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype.removeprefix("torch."))
        assert isinstance(dtype, torch.dtype)
        return dtype

    @property
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.torch_dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


class SequenceHash:
    """A running XXH3-64 over a tier's id, a sequence's extra key and its tokens so far. Its
    digest after a page, the page's key, stands for the page's tokens, its position and every
    token before it in that tier: a file tier seeds each page's checksum with it, so a page
    passes only for the sequence, the position and the tier it was written for."""

    def __init__(self, tier_id: bytes, extra_key: str | None) -> None:
        extra = b"" if extra_key is None else b"\x01" + extra_key.encode("utf-8", "surrogatepass")
        self._hash = xxhash.xxh3_64(tier_id + len(extra).to_bytes(8, "little") + extra)

    def copy(self) -> SequenceHash:
        twin = SequenceHash.__new__(SequenceHash)
        twin._hash = self._hash.copy()
        return twin

    def update(self, key_bytes: bytes) -> None:
        """Take in the tokens (int32 bytes) that come before the next pages."""
        self._hash.update(key_bytes)

    def page_keys(self, key_bytes: bytes, page_size: int) -> np.ndarray:
        """Take in ``key_bytes`` (int32 tokens, whole pages); the key of each page, uint64
        ``[num_pages]``."""
        step = 4 * page_size
        keys = np.empty(len(key_bytes) // step, dtype=np.uint64)
        for i in range(len(keys)):
            self._hash.update(key_bytes[i * step : (i + 1) * step])
            keys[i] = self._hash.intdigest()
        return keys


class KVTier:
    """A paged store of K/V over ``storage`` ``[num_layers, 2, num_slots, heads, head_dim]``."""

    def __init__(self, storage: torch.Tensor, layout: TierLayout, name: str) -> None:
        expected = (layout.num_layers, 2, storage.shape[2], layout.num_kv_heads, layout.head_dim)
        if tuple(storage.shape) != expected or storage.dtype != layout.torch_dtype:
            raise ValueError(f"tier storage {tuple(storage.shape)} does not fit {layout}")
        self.storage = storage
        self.layout = layout
        self.name = name
        self.allocator = TokenToKVPoolAllocator(storage.shape[2], layout.page_size)

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def available_size(self) -> int:
        return self.allocator.available_size()

    def used_size(self) -> int:
        return self.capacity - self.available_size()

    def sequence_hash(self, extra_key: str | None) -> SequenceHash | None:
        """The hash that keys this tier's pages for a sequence under ``extra_key``; ``None``:
        this tier keeps no checksums (host memory) and needs no keys."""
        return None

    def write(
        self, kv: KVCache, slots: torch.Tensor, page_keys: np.ndarray | None = None
    ) -> torch.Tensor | None:
        """Copy the K/V of pool ``slots`` (whole pages) into new tier slots and return them, in
        the same order; ``None`` (nothing written) when the tier is short. ``page_keys``: what
        each page holds (:meth:`SequenceHash.page_keys`), for a tier with checksums."""
        self._check_pool(kv)
        tier_slots = self.allocator.alloc(slots.numel())
        if tier_slots is None:
            return None
        src = slots.to(kv.device)
        for layer in range(self.layout.num_layers):
            k, v = kv.get_kv(layer)
            self.storage[layer, 0].index_copy_(0, tier_slots, k.index_select(0, src).cpu())
            self.storage[layer, 1].index_copy_(0, tier_slots, v.index_select(0, src).cpu())
        return tier_slots

    def read(self, tier_slots: torch.Tensor, kv: KVCache, slots: torch.Tensor) -> None:
        """Copy tier ``tier_slots`` into pool ``slots`` (same length, same order)."""
        self._check_pool(kv)
        if tier_slots.numel() != slots.numel():
            raise ValueError(f"{tier_slots.numel()} tier slots into {slots.numel()} pool slots")
        dst = slots.to(kv.device)
        for layer in range(self.layout.num_layers):
            k, v = kv.get_kv(layer)
            k.index_copy_(0, dst, self.storage[layer, 0].index_select(0, tier_slots).to(k.device))
            v.index_copy_(0, dst, self.storage[layer, 1].index_select(0, tier_slots).to(v.device))

    def forget(self, tier_slots: torch.Tensor) -> None:
        """Free tier slots (whole pages); their bytes stay until overwritten."""
        self.allocator.free(tier_slots)

    def claim(self, tier_slots: torch.Tensor) -> None:
        """Mark slots found in a restored tier as held (before any ``write``)."""
        self.allocator.claim(tier_slots)

    def corrupt_pages(self, tier_slots: torch.Tensor, page_keys: np.ndarray) -> torch.Tensor:
        """Per page of ``tier_slots`` (whole pages), whether it fails its checksum for
        ``page_keys``; a tier without checksums has none."""
        return torch.zeros(tier_slots.numel() // self.layout.page_size, dtype=torch.bool)

    def flush(self) -> None:
        """Make written bytes durable (a file tier); a no-op in memory."""

    def close(self) -> None:
        """Let go of what outlives the owner's use of the tier (a file tier's directory)."""

    def check_integrity(self, held: torch.Tensor) -> None:
        """The tier slots its owner holds and the free ones partition the tier."""
        self.allocator.check_integrity(held)

    def _check_pool(self, kv: KVCache) -> None:
        pool = (kv.num_layers, kv.num_kv_heads, kv.head_dim, str(kv.dtype))
        mine = (self.layout.num_layers, self.layout.num_kv_heads, self.layout.head_dim)
        if pool != (*mine, self.layout.dtype):
            raise ValueError(f"pool {pool} does not match the tier's layout {self.layout}")


def _num_slots(num_tokens: int, page_size: int) -> int:
    pages = max(num_tokens // page_size, 1) + 1  # page 0 is reserved, as in the pool
    return pages * page_size


def host_tier(layout: TierLayout, num_tokens: int, pin_memory: bool = False) -> KVTier:
    """A tier of ``num_tokens`` tokens in host memory."""
    shape = (
        layout.num_layers,
        2,
        _num_slots(num_tokens, layout.page_size),
        layout.num_kv_heads,
        layout.head_dim,
    )
    storage = torch.zeros(shape, dtype=layout.torch_dtype, pin_memory=pin_memory)
    return KVTier(storage, layout, "host")


class FileKVTier(KVTier):
    """A tier in ``DIR/kv.bin`` (memory-mapped) described by ``DIR/tier.json``, with a checksum
    per page in ``DIR/checksums.bin`` (memory-mapped, ``[num_slots // page_size]`` int64). It
    holds the directory's lock (the descriptor ``lock_fd``) until :meth:`close` or collection."""

    def __init__(
        self,
        storage: torch.Tensor,
        layout: TierLayout,
        path: Path,
        checksums: torch.Tensor,
        tier_id: bytes,
        lock_fd: int,
    ) -> None:
        super().__init__(storage, layout, f"file:{path}")
        self.path = path
        self.checksums = checksums
        self.tier_id = tier_id
        self.num_corrupt_pages = 0  # pages that failed their checksum (dropped, recomputed)
        self._unlock = weakref.finalize(self, os.close, lock_fd)

    def sequence_hash(self, extra_key: str | None) -> SequenceHash:
        return SequenceHash(self.tier_id, extra_key)

    def write(
        self, kv: KVCache, slots: torch.Tensor, page_keys: np.ndarray | None = None
    ) -> torch.Tensor | None:
        assert page_keys is not None, "a file tier's pages are written with their keys"
        # a saved index may name slots this write reuses: it is stale from now on
        (self.path / INDEX).unlink(missing_ok=True)
        tier_slots = super().write(kv, slots)
        if tier_slots is not None:
            pages = tier_slots[:: self.layout.page_size] // self.layout.page_size
            self.checksums[pages] = self.page_checksums(tier_slots, page_keys)
        return tier_slots

    def page_checksums(self, tier_slots: torch.Tensor, page_keys: np.ndarray) -> torch.Tensor:
        """The checksum of each page of ``tier_slots`` (whole pages, page after page) as stored
        now: the XXH3-64 hash of its K and V of every layer, seeded with its key from
        ``page_keys``; int64 ``[num_pages]``."""
        num_pages = tier_slots.numel() // self.layout.page_size
        if len(page_keys) != num_pages:
            raise ValueError(f"{len(page_keys)} page keys for {num_pages} pages")
        if num_pages == 0:
            return torch.zeros(0, dtype=torch.int64)
        # one gather, page-major: [slots, layers, 2, heads, head_dim], contiguous
        pages = self.storage.permute(2, 0, 1, 3, 4)[tier_slots]
        raw = pages.view(num_pages, -1).view(torch.uint8).numpy()
        seeded = zip(raw, page_keys.tolist(), strict=True)
        sums = np.fromiter(
            (xxhash.xxh3_64_intdigest(row, seed) for row, seed in seeded),
            dtype=np.uint64,
            count=num_pages,
        )
        return torch.from_numpy(sums.view(np.int64))

    def corrupt_pages(self, tier_slots: torch.Tensor, page_keys: np.ndarray) -> torch.Tensor:
        """Per page of ``tier_slots`` (whole pages), whether it fails the checksum written with
        it: its bytes changed, or ``page_keys`` (what the caller says it holds) are not the keys
        it was written with; counted in ``num_corrupt_pages``."""
        pages = tier_slots[:: self.layout.page_size] // self.layout.page_size
        bad = self.page_checksums(tier_slots, page_keys) != self.checksums[pages]
        self.num_corrupt_pages += int(bad.sum())
        return bad

    def flush(self) -> None:
        # torch's shared file mapping writes through the page cache; fsync makes it durable
        for name in (STORAGE, CHECKSUMS):
            fd = os.open(self.path / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Let go of the directory: another owner may open it (this tier is not used again)."""
        self._unlock()

    @property
    def closed(self) -> bool:
        return not self._unlock.alive


def file_tier(
    path: str | os.PathLike[str], layout: TierLayout, num_tokens: int, model_key: str
) -> tuple[FileKVTier, bool]:
    """A file tier in directory ``path`` holding ``num_tokens`` tokens, and whether it was
    reopened (``True``: its bytes are the ones a previous server wrote for the same model and
    layout; the owner restores what they hold). The tier holds the directory's lock until it is
    closed: :class:`TierUnavailable` (a ``ValueError``) if another owner holds it or the path
    cannot hold a tier. A mismatched, older or unreadable header, or a storage file that is
    missing or not of the tier's size, discards the old contents and index."""
    directory = Path(path)
    lock_fd = lock_tier_dir(directory)
    try:
        return _open(directory, layout, num_tokens, model_key, lock_fd)
    except OSError as e:
        os.close(lock_fd)
        raise TierUnavailable(directory, f"cannot write its files ({e.strerror or e})") from None
    except BaseException:
        os.close(lock_fd)
        raise


def _open(
    directory: Path, layout: TierLayout, num_tokens: int, model_key: str, lock_fd: int
) -> tuple[FileKVTier, bool]:
    num_slots = _num_slots(num_tokens, layout.page_size)
    header: dict = {"version": FORMAT_VERSION, "model_key": model_key, "num_slots": num_slots}
    header["layout"] = asdict(layout)
    numel = layout.num_layers * 2 * num_slots * layout.num_kv_heads * layout.head_dim
    nbytes = numel * torch.empty((), dtype=layout.torch_dtype).element_size()
    storage_file, checksum_file = directory / STORAGE, directory / CHECKSUMS
    num_pages = num_slots // layout.page_size
    old = _read_header(directory) or {}
    tier_id = _tier_id(old.pop("tier_id", None))
    same_header = old == header and tier_id is not None
    intact = _has_size(storage_file, nbytes) and _has_size(checksum_file, 8 * num_pages)
    reopened = same_header and intact
    if not reopened:
        if storage_file.exists() and old and old.get("version") != FORMAT_VERSION:
            logger.info(
                "KV tier %s: written in an older format (version %s, this one reads %d); "
                "discarding it",
                directory,
                old.get("version", 1),
                FORMAT_VERSION,
            )
        elif not same_header and storage_file.exists():
            logger.info("KV tier %s: written for another model or layout; discarding it", directory)
        elif same_header:
            logger.info(
                "KV tier %s: %s or %s missing or cut short; discarding it",
                directory,
                STORAGE,
                CHECKSUMS,
            )
        # an index names bytes of the old file: without them it would serve zeros
        for name in (STORAGE, CHECKSUMS, INDEX):
            (directory / name).unlink(missing_ok=True)
        tier_id = os.urandom(16)  # a new tier: no page of another one passes its checksums
    assert tier_id is not None
    flat = torch.from_file(str(storage_file), shared=True, size=numel, dtype=layout.torch_dtype)
    storage = flat.view(layout.num_layers, 2, num_slots, layout.num_kv_heads, layout.head_dim)
    checksums = torch.from_file(str(checksum_file), shared=True, size=num_pages, dtype=torch.int64)
    (directory / HEADER).write_text(json.dumps({**header, "tier_id": tier_id.hex()}, indent=1))
    tier = FileKVTier(storage, layout, directory, checksums, tier_id, lock_fd)
    return tier, reopened


def _tier_id(text: object) -> bytes | None:
    try:
        tier_id = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        return None
    return tier_id if len(tier_id) == 16 else None


def _has_size(path: Path, nbytes: int) -> bool:
    return path.exists() and path.stat().st_size == nbytes


def _read_header(directory: Path) -> dict | None:
    try:
        header = json.loads((directory / HEADER).read_text())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None
