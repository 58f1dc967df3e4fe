"""Shared by the tiered radix tree's tests: a small real KV pool whose K/V content is a
deterministic function of the token prefix, so any slot (pool or tier) can be checked against
what its prefix must hold."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_cache import KVCache
from radixserve.memory_pool.kv_tier import KVTier
from radixserve.radix.base import InsertResult
from radixserve.radix.tiered_cache import TieredRadixCache
from radixserve.radix.tree_node import TreeNode

LAYERS, HEADS, HEAD_DIM = 2, 1, 2
_ELEMS = LAYERS * 2 * HEADS * HEAD_DIM  # one token's K and V over all layers


@functools.lru_cache(maxsize=1 << 16)
def token_kv(extra: str | None, prefix: tuple[int, ...]) -> torch.Tensor:
    """The K/V ``[LAYERS, 2, HEADS, HEAD_DIM]`` of the last token of ``prefix``: 16-bit pieces
    of a hash of the whole prefix (and extra key), exact in float32, distinct per prefix."""
    data = repr(extra).encode() + b"|" + np.asarray(prefix, dtype=np.int32).tobytes()
    digest = hashlib.blake2b(data, digest_size=2 * _ELEMS).digest()
    values = np.frombuffer(digest, dtype=np.uint16).astype(np.float32)
    return torch.from_numpy(values.copy()).view(LAYERS, 2, HEADS, HEAD_DIM)


def expected_kv(key: Sequence[int], start: int, end: int, extra: str | None = None) -> torch.Tensor:
    """``[end - start, LAYERS, 2, HEADS, HEAD_DIM]``: what tokens ``start..end`` of ``key`` hold."""
    key = tuple(int(t) for t in key)
    rows = [token_kv(extra, key[: i + 1]) for i in range(start, end)]
    return torch.stack(rows) if rows else torch.empty(0, LAYERS, 2, HEADS, HEAD_DIM)


def new_pool(num_slots: int) -> KVCache:
    """A pool whose every slot holds NaN until written (a read of an unwritten slot shows)."""
    kv = KVCache(LAYERS, num_slots, HEADS, HEAD_DIM, dtype=torch.float32)
    for layer in range(LAYERS):
        for t in kv.get_kv(layer):
            t.fill_(float("nan"))
    return kv


def write_kv(
    kv: KVCache, slots: torch.Tensor, key: Sequence[int], extra: str | None = None
) -> None:
    """Compute (write) the K/V of ``key``'s tokens into ``slots`` (one slot per token)."""
    content = expected_kv(key, 0, len(key), extra)
    for layer in range(LAYERS):
        kv.set_kv(layer, slots, content[:, layer, 0], content[:, layer, 1])


def pool_kv(kv: KVCache, slots: torch.Tensor) -> torch.Tensor:
    """What the pool holds at ``slots``, shaped as :func:`expected_kv`."""
    per_layer = [torch.stack([t[slots] for t in kv.get_kv(layer)], 1) for layer in range(LAYERS)]
    return torch.stack(per_layer, 1)


def tier_kv(tier: KVTier, tier_slots: torch.Tensor) -> torch.Tensor:
    """What the tier holds at ``tier_slots``, shaped as :func:`expected_kv`."""
    return tier.storage[:, :, tier_slots].permute(2, 0, 1, 3, 4)


def path_of(node: TreeNode) -> list[TreeNode]:
    """The nodes from under the root down to ``node``."""
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out[::-1]


def path_tokens(node: TreeNode) -> list[int]:
    return [t for n in path_of(node) for t in n.key.tolist()]


def compute(
    kv: KVCache,
    alloc: TokenToKVPoolAllocator,
    tree: TieredRadixCache,
    key: Sequence[int],
    extra: str | None = None,
) -> torch.Tensor | None:
    """Fresh pool slots for all of ``key`` (evicting the tree when short), with its K/V
    written: what a forward computes. ``None`` when the pool cannot hold it."""
    ps = alloc.page_size
    need = -(-len(key) // ps) * ps
    slots = alloc.alloc(need)
    if slots is None:
        alloc.free(tree.evict(need))
        slots = alloc.alloc(need)
        if slots is None:
            return None
    slots = slots[: len(key)]
    write_kv(kv, slots, key, extra)
    return slots


def insert_computed(
    kv: KVCache,
    alloc: TokenToKVPoolAllocator,
    tree: TieredRadixCache,
    key: Sequence[int],
    extra: str | None = None,
) -> InsertResult | None:
    """Compute ``key`` and insert it as a finished request would (``KVManager.release``):
    free the slots the tree did not take. Returns the insert's result (``None``: no room)."""
    slots = compute(kv, alloc, tree, key, extra)
    if slots is None:
        return None
    result = tree.insert(list(key), slots, extra)
    aligned = len(key) - len(key) % alloc.page_size
    alloc.free(slots[: result.num_present])  # the tree held these tokens already
    alloc.free(slots[aligned:])  # a partial last page: never taken (frees the whole page)
    return result
