"""The gRPC relay's one-level view of KV events (``api/grpc/kv_events.py``): after a random
workload that moves pages between a small pool and a host tier, the pages a consumer of the
relayed proto batches holds are exactly those some medium of the tree holds."""

from __future__ import annotations

import random

import pytest
from kv_event_index import EventIndex
from tier_helpers import insert_computed, new_pool

from radixserve.api.grpc.kv_events import OneLevel, local_endpoint
from radixserve.memory_pool.allocator import TokenToKVPoolAllocator
from radixserve.memory_pool.kv_tier import TierLayout, host_tier
from radixserve.radix.kv_events import BlockRemoved, BlockStored, KVEventBatch, KVEventRecorder
from radixserve.radix.tiered_cache import TieredRadixCache


class ProtoIndex:
    """What smg's index holds of one worker: blocks stored and not removed since."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()

    def apply(self, batch: object) -> None:
        for event in batch.events:  # type: ignore[attr-defined]
            kind = event.WhichOneof("data")
            if kind == "stored":
                parent = (
                    event.stored.parent_block_hash
                    if event.stored.HasField("parent_block_hash")
                    else None
                )
                assert parent is None or parent in self.blocks, "a run under a page not held"
                for block in event.stored.blocks:
                    assert block.block_hash not in self.blocks, "stored twice"
                    self.blocks.add(block.block_hash)
            elif kind == "removed":
                for h in event.removed.block_hashes:
                    assert h in self.blocks, "removed a page not held"
                    self.blocks.remove(h)
            else:
                self.blocks.clear()


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
@pytest.mark.parametrize("seed", range(4))
def test_one_level_is_the_union_of_media(policy: str, seed: int) -> None:
    ps, pool = 2, 48
    kv = new_pool(pool + ps)
    alloc = TokenToKVPoolAllocator(pool + ps, ps)
    tree = TieredRadixCache(
        ps, host_tier(TierLayout.of(kv, ps), 64), kv, policy, KVEventRecorder(ps)
    )
    rng = random.Random(seed)
    docs = [[rng.randrange(3, 50) for _ in range(24)] for _ in range(5)]
    media, level, proto = EventIndex(), OneLevel(), ProtoIndex()
    moved = False
    for step in range(120):
        doc = rng.choice(docs)
        key = doc[: rng.randrange(2, 24)] + [rng.randrange(3, 50) for _ in range(rng.randrange(4))]
        if rng.random() < 0.3:  # a hit on the tier: load it back, as admission does
            match = tree.match_prefix(key)
            if match.tier_len:
                tree.inc_lock_ref(match.last_node)
                slots = alloc.alloc(match.tier_len)
                if slots is None:
                    alloc.free(tree.evict(match.tier_len))
                    slots = alloc.alloc(match.tier_len)
                if slots is not None:
                    tree.load_back(match.last_node, slots)
                tree.dec_lock_ref(match.last_node)
        else:
            insert_computed(kv, alloc, tree, key)
        events = tree.events.take()  # type: ignore[union-attr]
        if step == 100:
            tree.reset()
            alloc = TokenToKVPoolAllocator(pool + ps, ps)
            events += tree.events.take()  # type: ignore[union-attr]
        media.apply_events(events)
        proto.apply(level.convert(KVEventBatch(0.0, events), step))  # type: ignore[arg-type]
        held = set().union(*media.held.values()) if media.held else set()
        assert proto.blocks == held, f"step {step}"
        moved |= any(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in events)
    assert moved, "nothing left the pool: the workload did not exercise the tier"


def test_a_store_of_pages_partly_held_is_split_into_runs() -> None:
    level = OneLevel()
    first = BlockStored([1, 2], None, [10, 11], 1, None, "CPU_PINNED")
    level.convert(KVEventBatch(0.0, [first]), 0)  # type: ignore[arg-type]
    both = BlockStored([0, 1, 2, 3], None, [9, 10, 11, 12], 1, None, "GPU")  # 1, 2 held
    (a, b) = level.convert(KVEventBatch(0.0, [both]), 1).events  # type: ignore[arg-type]
    assert [x.block_hash for x in a.stored.blocks] == [0] and not a.stored.HasField(
        "parent_block_hash"
    )
    assert [x.block_hash for x in b.stored.blocks] == [3] and b.stored.parent_block_hash == 2
    gone = level.convert(KVEventBatch(0.0, [BlockRemoved([1, 2], "CPU_PINNED")]), 2)  # type: ignore[arg-type]
    assert not gone.events  # the pool still holds them
    assert local_endpoint("tcp://*:5557") == "tcp://127.0.0.1:5557"
    assert local_endpoint("tcp://0.0.0.0:5557") == "tcp://127.0.0.1:5557"
