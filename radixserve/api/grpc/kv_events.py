"""The KV events of ``--kv-events-config`` relayed to a gRPC subscriber (``SubscribeKvEvents``).

The relay subscribes to the publisher's own ZMQ socket (a wildcard host read as loopback) and
turns each batch into the proto's ``KvEventBatch``, under the publisher's sequence number.
smg's index has one level (it ignores ``cache_level``), so the relay reports a page as held
while any medium holds it: a store is passed on when a page enters its first medium, a removal
when it leaves its last. A page moved to the tier and back stays held throughout, and the
tier's later eviction of its copy does not erase the pool's. The counts are the
subscription's own. A subscriber sees what is stored and removed after it joins, as SGLang's
servicer relays it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from smg_grpc_proto.generated import common_pb2

from radixserve.kv_events_config import KVEventsConfig
from radixserve.radix.kv_events import BlockRemoved, BlockStored, KVEventBatch

POLL_S = 1.0


class OneLevel:
    """Media counts per page: the events of every medium as those of one level."""

    def __init__(self) -> None:
        self.media: dict[int, int] = {}
        self._next_id = 0

    def convert(self, batch: KVEventBatch, seq: int) -> common_pb2.KvEventBatch:
        out = common_pb2.KvEventBatch(sequence_number=seq, timestamp=batch.ts)
        if batch.attn_dp_rank is not None:
            out.dp_rank = batch.attn_dp_rank
        for event in batch.events:
            if isinstance(event, BlockStored):
                for stored in self._stored(event):
                    out.events.append(self._event(stored=stored))
            elif isinstance(event, BlockRemoved):
                gone = [h for h in event.block_hashes if self._drop(h)]
                if gone:
                    out.events.append(
                        self._event(removed=common_pb2.KvBlocksRemoved(block_hashes=gone))
                    )
            else:
                self.media.clear()
                out.events.append(self._event(cleared=common_pb2.KvCacheCleared()))
        return out

    def _stored(self, event: BlockStored) -> list[common_pb2.KvBlocksStored]:
        """One stored event per run of pages new to every medium, each under its parent."""
        size, parent = event.block_size, event.parent_block_hash
        runs: list[common_pb2.KvBlocksStored] = []
        run: common_pb2.KvBlocksStored | None = None
        for i, h in enumerate(event.block_hashes):
            held = self.media.get(h, 0)
            self.media[h] = held + 1
            if held:
                run = None  # a page held already: the next new one starts a run under it
            else:
                if run is None:
                    run = common_pb2.KvBlocksStored()
                    if parent is not None:
                        run.parent_block_hash = parent
                    runs.append(run)
                tokens = event.token_ids[i * size : (i + 1) * size]
                run.blocks.append(
                    common_pb2.KvBlock(block_hash=h, token_ids=tokens, block_size=size)
                )
            parent = h
        return runs

    def _drop(self, h: int) -> bool:
        held = self.media.get(h, 0)
        if held <= 1:
            self.media.pop(h, None)
            return True  # (unknown to this subscription: passed on, harmless to an index)
        self.media[h] = held - 1
        return False

    def _event(self, **data: Any) -> common_pb2.KvCacheEvent:
        self._next_id += 1
        return common_pb2.KvCacheEvent(event_id=self._next_id, **data)


def local_endpoint(endpoint: str) -> str:
    for wildcard in ("*", "0.0.0.0"):
        endpoint = endpoint.replace(f"//{wildcard}:", "//127.0.0.1:")
    return endpoint


async def relay_kv_events(
    config: KVEventsConfig, context: Any
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """Batches as they are published, until the subscriber cancels."""
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, config.topic.encode())
    sub.connect(local_endpoint(config.endpoint))
    decode = msgspec.msgpack.Decoder(KVEventBatch).decode
    level = OneLevel()
    try:
        while not context.cancelled():
            try:
                _, seq, payload = await asyncio.wait_for(sub.recv_multipart(), POLL_S)
            except asyncio.TimeoutError:
                continue
            yield level.convert(decode(payload), int.from_bytes(seq, "big"))
    finally:
        ctx.destroy(linger=0)
