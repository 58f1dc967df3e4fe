"""KVTier: a second, larger and slower store of KV pages under the device pool (issue #16).

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
  A header (``tier.json``) records the model, dtype, page size and shape: a tier written by
  another model or layout is discarded (with a log line), never read. Every page written gets an
  XXH3-64 hash of its bytes (all layers, K and V) in ``checksums.bin``; a restarted server checks the pages
  its index names and drops those whose bytes changed (``radix.tier_index``), so a corrupted
  file costs recomputation, never a wrong answer.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import xxhash

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_cache import KVCache

logger = logging.getLogger(__name__)

HEADER = "tier.json"
STORAGE = "kv.bin"
INDEX = "index.npz"  # what the tree held, written by ``radix.tier_index``
CHECKSUMS = "checksums.bin"  # int64 per page: the XXH3-64 hash of its bytes


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

    def write(self, kv: KVCache, slots: torch.Tensor) -> torch.Tensor | None:
        """Copy the K/V of pool ``slots`` (whole pages) into new tier slots and return them, in
        the same order; ``None`` (nothing written) when the tier is short."""
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

    def flush(self) -> None:
        """Make written bytes durable (a file tier); a no-op in memory."""

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
    per page in ``DIR/checksums.bin`` (memory-mapped, ``[num_slots // page_size]`` int64)."""

    def __init__(
        self, storage: torch.Tensor, layout: TierLayout, path: Path, checksums: torch.Tensor
    ) -> None:
        super().__init__(storage, layout, f"file:{path}")
        self.path = path
        self.checksums = checksums
        self.num_corrupt_pages = 0  # pages that failed their checksum (dropped, recomputed)

    def write(self, kv: KVCache, slots: torch.Tensor) -> torch.Tensor | None:
        # a saved index may name slots this write reuses: it is stale from now on
        (self.path / INDEX).unlink(missing_ok=True)
        tier_slots = super().write(kv, slots)
        if tier_slots is not None:
            pages = tier_slots[:: self.layout.page_size] // self.layout.page_size
            self.checksums[pages] = self.page_checksums(tier_slots)
        return tier_slots

    def page_checksums(self, tier_slots: torch.Tensor) -> torch.Tensor:
        """The XXH3-64 hash of each page of ``tier_slots`` (whole pages, page after page) as
        stored now: its K and V of every layer, int64 ``[num_pages]``."""
        if tier_slots.numel() == 0:
            return torch.zeros(0, dtype=torch.int64)
        # one gather, page-major: [slots, layers, 2, heads, head_dim], contiguous
        pages = self.storage.permute(2, 0, 1, 3, 4)[tier_slots]
        raw = pages.view(tier_slots.numel() // self.layout.page_size, -1).view(torch.uint8)
        digests = b"".join(xxhash.xxh3_64_digest(row) for row in raw.numpy())
        return torch.from_numpy(np.frombuffer(digests, dtype=np.int64).copy())

    def corrupt_pages(self, tier_slots: torch.Tensor) -> torch.Tensor:
        """Per page of ``tier_slots`` (whole pages), whether its bytes no longer match the
        checksum written with them; counted in ``num_corrupt_pages``."""
        pages = tier_slots[:: self.layout.page_size] // self.layout.page_size
        bad = self.page_checksums(tier_slots) != self.checksums[pages]
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


def file_tier(
    path: str | os.PathLike[str], layout: TierLayout, num_tokens: int, model_key: str
) -> tuple[FileKVTier, bool]:
    """A file tier in directory ``path`` holding ``num_tokens`` tokens, and whether it was
    reopened (``True``: its bytes are the ones a previous server wrote for the same model and
    layout; the owner restores what they hold). A mismatched or unreadable header, or a storage
    file that is missing or not of the tier's size, discards the old contents and index."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    num_slots = _num_slots(num_tokens, layout.page_size)
    header = {"model_key": model_key, "num_slots": num_slots, "layout": asdict(layout)}
    numel = layout.num_layers * 2 * num_slots * layout.num_kv_heads * layout.head_dim
    nbytes = numel * torch.empty((), dtype=layout.torch_dtype).element_size()
    storage_file, checksum_file = directory / STORAGE, directory / CHECKSUMS
    num_pages = num_slots // layout.page_size
    same_header = _read_header(directory) == header
    intact = _has_size(storage_file, nbytes) and _has_size(checksum_file, 8 * num_pages)
    reopened = same_header and intact
    if not reopened:
        if not same_header and storage_file.exists():
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
    flat = torch.from_file(str(storage_file), shared=True, size=numel, dtype=layout.torch_dtype)
    storage = flat.view(layout.num_layers, 2, num_slots, layout.num_kv_heads, layout.head_dim)
    checksums = torch.from_file(str(checksum_file), shared=True, size=num_pages, dtype=torch.int64)
    (directory / HEADER).write_text(json.dumps(header, indent=1))
    return FileKVTier(storage, layout, directory, checksums), reopened


def _has_size(path: Path, nbytes: int) -> bool:
    return path.exists() and path.stat().st_size == nbytes


def _read_header(directory: Path) -> dict | None:
    try:
        header = json.loads((directory / HEADER).read_text())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None
