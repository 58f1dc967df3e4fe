"""The index of a file tier: which token prefixes its slots hold, so a restarted server hits them.

``save_index`` first copies to the tier what the pool holds and the tier does not
(``write_back`` writes only on eviction otherwise), makes the tier's bytes durable, then writes
``DIR/index.npz``: every node with a tier copy that is reachable from the root through nodes
with tier copies, parents first, as its parent's position, its tokens, its tier slots and its
extra key. ``restore_index`` hangs them in a fresh tree as tier-only nodes (their slots held
again) and deletes the file: from then on the tier is written again, so an index on disk would
go stale (``FileKVTier.write`` deletes it too). A crash therefore loses the index, never serves
wrong KV. The tier's header (``tier.json``: format, model, dtype, page size, shape, tier id)
decides whether the bytes are the same model's at all; the index is read only for a tier
reopened under a matching header, and only if it names the same tier id. An entry is restored
only if its parent is, and every page of it passes the checksum it was written with for the
tokens the index gives it and those above it (``FileKVTier.corrupt_pages``): bytes changed,
tokens or parents changed in the index, or pages another tier wrote are all caught there.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile

import numpy as np
import torch

from radixserve.memory_pool.kv_tier import INDEX, FileKVTier, SequenceHash
from radixserve.radix.tiered_cache import TieredRadixCache
from radixserve.radix.tree_node import TreeNode

logger = logging.getLogger(__name__)


def save_index(tree: TieredRadixCache) -> int:
    """Write the index of ``tree``'s file tier; returns the nodes written (0: not a file tier,
    or one closed: its directory may be another owner's now)."""
    tier = tree.tier
    if not isinstance(tier, FileKVTier) or tier.closed:
        return 0
    tree.write_back_all()
    parents: list[int] = []
    keys: list[bytes] = []
    slots: list[torch.Tensor] = []
    extra: list[str | None] = []
    queue: list[tuple[int, TreeNode]] = [(-1, c) for c in tree.root.children.values()]
    while queue:
        parent, node = queue.pop()
        if node.tier_value is None:
            continue  # neither it nor what hangs under it can be restored without it
        index = len(parents)
        parents.append(parent)
        keys.append(node.key_bytes)
        slots.append(node.tier_value)
        extra.append(node.extra_key)
        queue.extend((index, c) for c in node.children.values())
    tier.flush()  # the bytes first, then the index that names them
    path = tier.path / INDEX
    tmp = path.with_suffix(".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez(
            f,
            parents=np.asarray(parents, dtype=np.int64),
            key_lens=np.asarray([len(k) // 4 for k in keys], dtype=np.int64),
            keys=np.frombuffer(b"".join(keys), dtype=np.int32),
            slots=torch.cat(slots).numpy() if slots else np.zeros(0, np.int64),
            extra=np.asarray(json.dumps(extra)),
            tier_id=np.asarray(tier.tier_id.hex()),
        )
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(parents)


def restore_index(tree: TieredRadixCache) -> int:
    """Restore a reopened file tier's index into the empty ``tree``; returns the tokens restored.
    The index file is deleted either way; one that cannot be read is discarded with a log line."""
    tier = tree.tier
    if not isinstance(tier, FileKVTier):
        return 0
    path = tier.path / INDEX
    if not path.exists():
        return 0
    try:
        with np.load(path) as data:
            parents, key_lens = data["parents"], data["key_lens"]
            keys, slots = data["keys"], torch.from_numpy(data["slots"].copy())
            extra = json.loads(str(data["extra"]))
            if str(data["tier_id"]) != tier.tier_id.hex():
                raise ValueError("the index of another tier")
        restored = _restore(tree, parents, key_lens, keys, slots, extra)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        logger.warning("KV tier %s: index unreadable (%s); starting empty", tier.path, e)
        restored = 0
    path.unlink(missing_ok=True)
    return restored


def _restore(
    tree: TieredRadixCache,
    parents: np.ndarray,
    key_lens: np.ndarray,
    keys: np.ndarray,
    slots: torch.Tensor,
    extra: list[str | None],
) -> int:
    """Check the whole index first, then claim its slots in one call and build the nodes."""
    ps = tree.page_size
    if (
        keys.dtype != np.int32
        or slots.dtype != torch.int64
        or any(a.dtype.kind != "i" or a.ndim != 1 for a in (parents, key_lens, keys))
        or not isinstance(extra, list)
        or not all(e is None or isinstance(e, str) for e in extra)
    ):
        raise ValueError("index arrays have the wrong types")
    if not (len(parents) == len(key_lens) == len(extra)) or int(key_lens.sum()) != len(keys):
        raise ValueError("index arrays disagree")
    if len(slots) != len(keys) or len(torch.unique(slots)) != len(slots):
        raise ValueError("index slots are not one per token")
    if len(slots) and not (ps <= int(slots.min()) and int(slots.max()) < tree.tier.capacity + ps):
        raise ValueError("index slots do not fit the tier")
    order = np.arange(len(parents))
    if (
        ((parents < -1) | (parents >= order)).any()
        or (key_lens <= 0).any()
        or (key_lens % ps).any()
    ):
        raise ValueError("index entries are malformed")
    pages = slots.view(-1, ps)  # every node is whole pages: each row is one page of one node
    if (pages[:, 0] % ps).any() or (pages != pages[:, :1] + torch.arange(ps)).any():
        raise ValueError("index slots are not whole pages")
    children: set[tuple[int, str | None, bytes]] = set()
    off = 0
    for i, (parent, n) in enumerate(zip(parents.tolist(), key_lens.tolist(), strict=True)):
        child = (parent, extra[i], keys[off : off + ps].tobytes())
        if child in children or (parent >= 0 and extra[i] != extra[parent]):
            raise ValueError("index entries overlap")  # two would be one node of the tree
        children.add(child)
        off += n
    keep = _intact_entries(tree, parents, key_lens, keys, slots, extra)
    kept_tokens = np.repeat(keep, key_lens)
    tree.tier.claim(slots[torch.from_numpy(kept_tokens)])
    nodes: dict[int, TreeNode] = {}
    off = 0
    for i, (parent, n) in enumerate(zip(parents.tolist(), key_lens.tolist(), strict=True)):
        if keep[i]:
            above = tree.root if parent < 0 else nodes[parent]
            key_bytes = keys[off : off + n].tobytes()
            nodes[i] = tree.restore_node(above, key_bytes, slots[off : off + n], extra[i])
        off += n
    return int(kept_tokens.sum())


def _intact_entries(
    tree: TieredRadixCache,
    parents: np.ndarray,
    key_lens: np.ndarray,
    keys: np.ndarray,
    slots: torch.Tensor,
    extra: list[str | None],
) -> np.ndarray:
    """Which index entries to restore: those whose every page passes the checksum it was
    written with for the tokens the index puts on its path, under a parent that is restored
    (a prefix without its parent is no prefix). The others' slots stay free: a request that
    needs them computes them again."""
    tier = tree.tier
    assert isinstance(tier, FileKVTier)
    ps = tree.page_size
    after: list[SequenceHash] = []  # per entry: the hash of its path's tokens, through its own
    page_keys: list[np.ndarray] = []
    ends = np.cumsum(key_lens)
    for i, parent in enumerate(parents.tolist()):
        seq = tier.sequence_hash(extra[i]) if parent < 0 else after[parent].copy()
        page_keys.append(seq.page_keys(keys[ends[i] - key_lens[i] : ends[i]].tobytes(), ps))
        after.append(seq)
    all_keys = np.concatenate(page_keys) if page_keys else np.zeros(0, np.uint64)
    bad_pages = tier.corrupt_pages(slots, all_keys).numpy()
    entry_of_page = np.repeat(np.arange(len(parents)), key_lens // ps)
    bad = np.zeros(len(parents), dtype=bool)
    bad[entry_of_page[bad_pages]] = True
    keep = np.zeros(len(parents), dtype=bool)
    for i, parent in enumerate(parents.tolist()):  # parents come before their children
        keep[i] = not bad[i] and (parent < 0 or keep[parent])
    if not keep.all():
        logger.warning(
            "KV tier %s: %d pages failed their checksum; %d of %d tokens dropped (computed "
            "again when asked)",
            tier.path,
            int(bad_pages.sum()),
            int(key_lens[~keep].sum()),
            int(key_lens.sum()),
        )
    return keep
