"""KV events: the radix tree's changes as SGLang and vLLM engines publish them.

A cache-aware gateway (smg, Dynamo, AIBrix) can follow what each engine really holds instead of
guessing from the requests it sent. The engine publishes, per scheduler step, one
``KVEventBatch`` of

- ``BlockStored``: pages that entered a medium, with their tokens, each page's hash and the hash
  of the page before the first (a chain: a page's hash depends on every token before it);
- ``BlockRemoved``: pages that left a medium;
- ``AllBlocksCleared``: the cache was flushed.

The wire format is SGLang's (``sglang.srt.disaggregation.kv_events``, 0.5.23): msgspec
msgpack, the batch an array ``[ts, events, attn_dp_rank]``, each event a map tagged
``type``: the class name, optional fields left out when unset. Page hashes are SGLang's chain:
a page's digest is SHA-256 of the previous page's digest (none for a path's first page) and the
page's tokens as little-endian uint32; its published hash is the digest's first 8 bytes read
as a big-endian signed int64. In a cache namespace (an adapter, ``extra_key``,
``cache_salt``, a tenant: the tree's extra key) the published hash is SGLang's
``namespaced_block_hash`` of it, seeded by the namespace, so the same tokens in two namespaces
are two blocks to a consumer. (SGLang's default format leaves non-LoRA namespaces out of the
hash; its "dynamo" format namespaces them all, as here.)

``medium`` names the level, as SGLang's ``StorageMedium``: ``GPU`` is the pool the model reads
(L1, on whatever device), ``CPU_PINNED`` the host tier, ``DISK`` the file tier.

The tree calls :class:`KVEventRecorder` at the few places a node enters or leaves a medium;
with no recorder (the default) it pays one ``is None`` test there and nothing else.
"""

from __future__ import annotations

import hashlib

import msgspec
import numpy as np

from radixserve.radix.tree_node import TreeNode
from radixserve.radix.tree_observer import FILE_TIER, HOST_TIER, POOL

L1 = "GPU"  # the pool (SGLang's StorageMedium.GPU: device memory, the level the model reads)
HOST = "CPU_PINNED"
DISK = "DISK"
WIRE_MEDIUM = {POOL: L1, HOST_TIER: HOST, FILE_TIER: DISK}  # the tree's media, as SGLang names them

_NAMESPACE_SEED_TAG = b"sglang-kv-event-namespace-v1"


class EventBatch(msgspec.Struct, array_like=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list
    attn_dp_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """A tagged msgpack map: ``type`` is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]  # type: ignore[assignment]


DIGEST = 32  # bytes of a SHA-256 digest


def page_digests(key_bytes: bytes, page_bytes: int, prior: bytes = b"") -> bytes:
    """SGLang's chain over whole pages of int32 tokens (``key_bytes``, little-endian), after the
    digest ``prior`` (empty: a path's first page): the pages' digests, end to end."""
    sha = hashlib.sha256
    out = []
    for off in range(0, len(key_bytes), page_bytes):
        prior = sha(prior + key_bytes[off : off + page_bytes]).digest()
        out.append(prior)
    return b"".join(out)


def digests_to_int64(digests: bytes) -> list[int]:
    """SGLang's ``hash_str_to_int64`` of each digest: its first 16 hex digits, a signed int64."""
    return np.frombuffer(digests, dtype=">i8")[:: DIGEST // 8].tolist()


def namespace_seed(namespace: str | None) -> bytes | None:
    """SGLang's ``kv_event_namespace_seed(extra_key=namespace, cache_salt=None)``."""
    if namespace is None:
        return None
    encoded = namespace.encode("utf-8")
    h = hashlib.sha256(_NAMESPACE_SEED_TAG)
    h.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded + b"\x00")
    return h.digest()


def namespaced_block_hash(block_hash: int, seed: bytes | None) -> int:
    """SGLang's ``namespaced_block_hash``: unchanged without a seed."""
    if seed is None:
        return block_hash
    digest = hashlib.sha256(seed + block_hash.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class KVEventRecorder:
    """Queues the events of one tree; the publisher :meth:`take` s them once per step.

    A node's page digests are computed once, when it is first published, and kept on the node
    (``event_digests``, 32 bytes a page; a split divides them), so a page keeps its hash in
    every medium."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._page_bytes = 4 * page_size
        self._queue: list[KVCacheEvent] = []
        self._seeds: dict[str | None, bytes | None] = {}

    def stored(self, node: TreeNode, medium: str) -> None:
        medium = WIRE_MEDIUM[medium]
        hashes = self._hashes(node)
        parent = node.parent
        parent_hash = None
        if parent is not None and parent.parent is not None:  # not under the root
            last = self._digests(parent)[-DIGEST:]
            parent_hash = namespaced_block_hash(
                digests_to_int64(last)[0], self._seed(parent.extra_key)
            )
        tail = self._queue[-1] if self._queue else None
        if (  # one event for a chain of stores, as SGLang coalesces them
            type(tail) is BlockStored
            and tail.medium == medium
            and tail.block_hashes[-1] == parent_hash
        ):
            tail.block_hashes.extend(hashes)
            tail.token_ids.extend(node.key.tolist())
            return
        self._queue.append(
            BlockStored(hashes, parent_hash, node.key.tolist(), self.page_size, None, medium)
        )

    def removed(self, node: TreeNode, medium: str) -> None:
        medium = WIRE_MEDIUM[medium]
        hashes = self._hashes(node)
        tail = self._queue[-1] if self._queue else None
        if type(tail) is BlockRemoved and tail.medium == medium:
            tail.block_hashes.extend(hashes)
        else:
            self._queue.append(BlockRemoved(hashes, medium))

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        """Each part keeps its pages' hashes (if published: a page's hash never changes)."""
        if lower.event_digests is not None:
            cut = len(upper) // self.page_size * DIGEST
            upper.event_digests = lower.event_digests[:cut]
            lower.event_digests = lower.event_digests[cut:]

    def all_cleared(self) -> None:
        self._queue.append(AllBlocksCleared())

    def take(self) -> list[KVCacheEvent]:
        events, self._queue = self._queue, []
        return events

    def _hashes(self, node: TreeNode) -> list[int]:
        hashes = digests_to_int64(self._digests(node))
        seed = self._seed(node.extra_key)
        return hashes if seed is None else [namespaced_block_hash(h, seed) for h in hashes]

    def _digests(self, node: TreeNode) -> bytes:
        """``node``'s page digests, computing those of its ancestors first where missing."""
        missing = []
        n = node
        while n.event_digests is None and n.parent is not None:  # (the root has none)
            missing.append(n)
            n = n.parent
        prior = n.event_digests[-DIGEST:] if n.event_digests is not None else b""
        for m in reversed(missing):
            m.event_digests = page_digests(m.key_bytes, self._page_bytes, prior)
            prior = m.event_digests[-DIGEST:]
        return node.event_digests  # type: ignore[return-value]  # (just set)

    def _seed(self, namespace: str | None) -> bytes | None:
        if namespace not in self._seeds:
            self._seeds[namespace] = namespace_seed(namespace)
        return self._seeds[namespace]
