"""KV events: the page hashes (SGLang's chain), the wire (SGLang's own structs decode it), the
publisher's PUB and replay sockets. The tree's events against its contents are checked after
every step of the property tests (test_radix_property.py, test_tiered_property.py)."""

from __future__ import annotations

import hashlib
import struct
import sys
import time
import types

import msgspec
import pytest
import torch
import zmq
from sglang_wheel import sglang_source

from radixserve.kv_events_config import KVEventsConfig, offset_endpoint
from radixserve.radix import RadixCache
from radixserve.radix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventRecorder,
)
from radixserve.server.kv_event_publisher import END_SEQ, KVEventPublisher


def chain(tokens: list[int], page_size: int) -> list[int]:
    """SGLang's page hashes, written from its hash_binding.cpp: SHA-256 of the previous page's
    digest and the page's tokens as little-endian uint32; the first 8 bytes, big-endian, signed."""
    out, prior = [], b""
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        page = tokens[i : i + page_size]
        prior = hashlib.sha256(prior + struct.pack(f"<{len(page)}I", *page)).digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out


def stored_hashes(events: list) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


@pytest.mark.parametrize("page_size", [1, 4])
def test_hashes_are_sglangs_chain_whatever_the_splits(page_size: int) -> None:
    tree = RadixCache(page_size, KVEventRecorder(page_size))
    a = list(range(100, 124))
    b = a[:12] + list(range(500, 512))  # splits a's node after 12 tokens
    tree.insert(a, torch.arange(len(a)))
    first = tree.events.take()
    assert stored_hashes(first) == chain(a, page_size)
    assert first[0].parent_block_hash is None
    tree.insert(b, torch.arange(len(b)))
    (event,) = tree.events.take()
    assert event.parent_block_hash == chain(a, page_size)[12 // page_size - 1]
    assert event.block_hashes == chain(b, page_size)[12 // page_size :]
    assert event.token_ids == b[12:]
    assert tree.evict(36).shape[0] == 36  # both leaves, then the shared node
    (removed,) = tree.events.take()  # coalesced: one event
    assert isinstance(removed, BlockRemoved)
    assert sorted(removed.block_hashes) == sorted(set(chain(a, page_size) + chain(b, page_size)))


def test_namespaces_are_separate_blocks_and_flush_clears() -> None:
    tree = RadixCache(1, KVEventRecorder(1))
    tree.insert([1, 2, 3], torch.arange(3))
    tree.insert([1, 2, 3], torch.arange(3, 6), extra_key="tenant:a")
    plain, spaced = tree.events.take()
    assert plain.token_ids == spaced.token_ids
    assert not set(plain.block_hashes) & set(spaced.block_hashes)
    tree.reset()
    assert [type(e) for e in tree.events.take()] == [AllBlocksCleared]


def test_a_tree_without_events_stays_silent() -> None:
    tree = RadixCache(1)
    tree.insert([1, 2, 3], torch.arange(3))
    tree.evict(3)
    assert tree.events is None
    with pytest.raises(ValueError, match="pages"):
        RadixCache(4, KVEventRecorder(1))


def _load_sglang_kv_events() -> types.ModuleType:
    """SGLang's ``kv_events.py`` from its wheel, run here: two modules it imports for its
    socket helpers are stubbed (the structs and hash functions use neither)."""
    source = sglang_source("sglang/srt/disaggregation/kv_events.py")
    stubs = {
        "sglang.srt.runtime_context": {"get_parallel": None},
        "sglang.srt.utils.network": {"NetworkAddress": None},
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    try:
        for name, attrs in stubs.items():
            sys.modules[name] = types.SimpleNamespace(**attrs)  # type: ignore[assignment]
        module = types.ModuleType("sglang_kv_events")
        sys.modules[module.__name__] = module  # msgspec resolves annotations through it
        exec(compile(source, "sglang/srt/disaggregation/kv_events.py", "exec"), module.__dict__)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sglangs_own_structs_decode_our_batches_and_agree_on_namespaces() -> None:
    theirs = _load_sglang_kv_events()
    tree = RadixCache(2, KVEventRecorder(2))
    tree.insert([5, 6, 7, 8], torch.arange(4))
    tree.insert([5, 6, 9, 9], torch.arange(4), extra_key="lora:x")
    tree.evict(4)
    tree.reset()
    ours = tree.events.take()
    payload = msgspec.msgpack.encode(KVEventBatch(12.5, ours, 3))
    batch = msgspec.msgpack.Decoder(theirs.KVEventBatch).decode(payload)
    assert (batch.ts, batch.attn_dp_rank) == (12.5, 3)
    assert [type(e).__name__ for e in batch.events] == [type(e).__name__ for e in ours]
    for mine, decoded in zip(ours, batch.events, strict=True):
        assert msgspec.structs.asdict(mine) == msgspec.structs.asdict(decoded)
    # a namespaced page: SGLang's namespaced_block_hash of the plain chain, its seed
    seed = theirs.kv_event_namespace_seed(extra_key="lora:x", cache_salt=None)
    plain = chain([5, 6, 9, 9], 2)
    assert ours[1].block_hashes == [
        theirs.namespaced_block_hash(h, namespace_seed=seed) for h in plain
    ]
    assert theirs.ZmqEventPublisher.offset_endpoint_port("tcp://*:5557", 2) == offset_endpoint(
        "tcp://*:5557", 2
    )


def test_publisher_sends_sequenced_batches_and_replays(tmp_path: object) -> None:
    endpoint, replay = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    config = KVEventsConfig.from_cli(
        f'{{"publisher": "zmq", "endpoint": "{endpoint}", "replay_endpoint": "{replay}", '
        '"topic": "kv"}'
    )
    publisher = KVEventPublisher(config, dp_rank=1)
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(endpoint)
        time.sleep(0.3)  # PUB/SUB: a subscriber sees only what is sent after it joined
        decode = msgspec.msgpack.Decoder(KVEventBatch).decode
        for n in range(3):
            publisher.publish([BlockRemoved([n], "GPU")])
        got = []
        for _ in range(3):
            assert sub.poll(5000), "no batch arrived"
            topic, seq, payload = sub.recv_multipart()
            batch = decode(payload)
            got.append((topic, int.from_bytes(seq, "big"), batch.events[0].block_hashes))
            assert batch.attn_dp_rank == 1
        assert got == [(b"kv", n, [n]) for n in range(3)]
        req = ctx.socket(zmq.DEALER)
        req.connect(replay)
        req.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = []
        while True:
            assert req.poll(5000), "the replay did not answer"
            _, topic, seq, payload = req.recv_multipart()
            if seq == END_SEQ:
                break
            replayed.append((int.from_bytes(seq, "big"), decode(payload).events[0].block_hashes))
        assert replayed == [(1, [1]), (2, [2])]
    finally:
        ctx.destroy(linger=0)
        publisher.shutdown()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ('{"publisher": "kafka"}', "publisher"),
        ('{"publisher": "zmq", "endpoint": "http://x"}', "not a zmq endpoint"),
        ('{"publisher": "zmq", "nope": 1}', "nope"),
        ("not json", "kv-events-config"),
    ],
)
def test_bad_configs_are_refused(value: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        KVEventsConfig.from_cli(value)


def test_rank_offsets() -> None:
    config = KVEventsConfig.from_cli(
        '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600"}'
    )
    ranked = config.for_rank(2)
    assert (ranked.endpoint, ranked.replay_endpoint) == ("tcp://*:5559", "tcp://*:5602")
    assert offset_endpoint("ipc:///tmp/e", 1) == "ipc:///tmp/e_dp1"
    assert config.for_rank(0) == config
