"""The KV event publisher: SGLang's ``ZmqEventPublisher`` wire, on its own thread.

Each scheduler step's events (``radix.kv_events``) go out as one ``KVEventBatch`` on a zmq PUB
socket: three frames, the topic, a sequence number (8 bytes, big-endian, from 0) and the msgpack
payload. The last ``buffer_steps`` batches are kept: a subscriber that joined late or saw a gap
in the sequence sends, on the ROUTER ``replay_endpoint``, ``[b"", start_seq (8 bytes)]`` and gets
every kept batch from ``start_seq`` as ``[b"", topic, seq, payload]``, then
``[b"", b"", -1 (8 bytes, signed), b""]``.

The scheduler only queues a batch (:meth:`publish`); encoding and sending run on the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgspec
import zmq

from radixserve.kv_events_config import KVEventsConfig
from radixserve.radix.kv_events import KVCacheEvent, KVEventBatch

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.05


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig, dp_rank: int = 0) -> None:
        self.dp_rank = dp_rank
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        bind = config.bind
        if bind is None:
            bind = config.endpoint.startswith(("ipc://", "inproc://")) or any(
                host in config.endpoint for host in ("*", "0.0.0.0", "::")
            )
        try:
            if bind:
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            self._replay = None
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise ValueError(f"--kv-events-config: cannot open {config.endpoint}: {exc}") from None
        self.num_dropped = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Queue one step's events (a full queue drops them: the sending thread fell behind;
        logged at the first drop and every 1000th)."""
        batch = KVEventBatch(time.time(), events, self.dp_rank)  # type: ignore[arg-type]
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.num_dropped += 1
            if self.num_dropped % 1000 == 1:
                logger.warning("KV events: %d batches dropped (queue full)", self.num_dropped)

    def shutdown(self, timeout: float = 1.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        self._ctx.destroy(linger=0)

    def _run(self) -> None:
        encode = msgspec.msgpack.Encoder().encode
        seq = 0
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            payload = encode(batch)
            seq_bytes = seq.to_bytes(8, "big")
            self._pub.send_multipart((self._topic, seq_bytes, payload))
            self._buffer.append((seq, payload))
            seq += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("KV events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
