"""A server with ``--kv-events-config``: a subscriber rebuilds the cache from the published KV
events alone and finds what ``/cache_tree`` shows, after a random workload that evicts from a
small pool into the host tier and out of it, uses cache namespaces and flushes the cache; a
subscriber that joins late gets the same from the replay socket."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from kv_event_index import Contents, EventIndex, contents_of_nodes
from serving_harness import Server, free_port, serving

from radixserve.radix.kv_events import HOST
from radixserve.server.kv_event_publisher import END_SEQ

POOL = 192
GREEDY = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
# slow: a server of its own (about 8 s to start) for four checks; .ci/run runs them after the
# default suite
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


class Subscriber:
    """A SUB socket drained by a thread into an :class:`EventIndex`; sequence numbers checked.
    The index checks every event as it applies it: a check that fails in the thread is raised
    in the test by :meth:`contents` and :meth:`close`."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.index = EventIndex()
        self.seqs: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.sub.poll(50):
                    _, seq, payload = self.sub.recv_multipart()
                    self.seqs.append(int.from_bytes(seq, "big"))
                    self.index.apply_payload(payload)
        except BaseException as exc:  # raised in the test's thread
            self.error = exc

    def _raise_error(self) -> None:
        if self.error is not None:
            raise AssertionError("the subscriber's thread failed") from self.error

    def contents(self) -> Contents:
        self._raise_error()
        return self.index.contents()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.ctx.destroy(linger=0)
        assert not self._thread.is_alive(), "the subscriber's thread did not stop"
        self._raise_error()


def replayed_index(replay: str) -> tuple[EventIndex, int]:
    """Every batch the publisher kept, from sequence 0, through its ROUTER socket."""
    ctx = zmq.Context()
    try:
        req = ctx.socket(zmq.DEALER)
        req.connect(replay)
        req.send_multipart([b"", (0).to_bytes(8, "big")])
        index, n = EventIndex(), 0
        while True:
            assert req.poll(10_000), "the replay socket did not answer"
            _, _, seq, payload = req.recv_multipart()
            if seq == END_SEQ:
                return index, n
            assert int.from_bytes(seq, "big") == n
            index.apply_payload(payload)
            n += 1
    finally:
        ctx.destroy(linger=0)


def cache_tree_contents(server: Server) -> object:
    with server.client() as c:
        tree = c.get("/cache_tree", params={"max_nodes": 2000, "token_ids": True}).json()["tree"]
    assert tree["shown_nodes"] == tree["total_nodes"]
    rows = [(n["id"], n["parent"], n["token_ids"], n["where"]) for n in tree["nodes"]]
    return contents_of_nodes(rows, 1, HOST)


@pytest.fixture(scope="module")
def events_server(
    api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, str, str]]:
    tmp = tmp_path_factory.mktemp("kv-events-server")
    pub, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    config = {"publisher": "zmq", "endpoint": pub, "bind": True, "replay_endpoint": replay}
    args = ["--model", str(api_model_dir), "--max-total-tokens", str(POOL)]
    args += ["--enable-hierarchical-cache", "--kv-events-config", json.dumps(config)]
    with serving(args, tmp / "server.log") as srv:
        yield srv, pub, replay


def test_events_rebuild_the_cache_tree(events_server: tuple[Server, str, str]) -> None:
    server, pub, replay = events_server
    live = Subscriber(pub)
    time.sleep(0.5)  # PUB/SUB: joined before the first batch
    rng = random.Random(7)
    docs = [[rng.randrange(3, 200) for _ in range(90)] for _ in range(4)]
    try:
        with server.client() as c:
            for i in range(36):
                doc = docs[rng.randrange(len(docs))]
                ids = doc[: rng.randrange(20, 90)] + [rng.randrange(3, 200) for _ in range(8)]
                body = {"input_ids": ids, "sampling_params": GREEDY}
                if i % 3 == 0:
                    body["extra_key"] = "ns-b"
                resp = c.post("/generate", json=body)
                assert resp.status_code == 200, resp.text
                if i == 20:
                    assert c.post("/flush_cache").status_code == 200
        want = cache_tree_contents(server)
        assert any(medium == HOST for _, medium in want), "nothing reached the tier"
        deadline = time.monotonic() + 10
        while live.contents() != want and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live.contents() == want
        assert live.seqs == list(range(len(live.seqs))), "a gap in the sequence"
    finally:
        live.close()
    late, n = replayed_index(replay)
    assert n == len(live.seqs)
    assert late.contents() == want
    with server.client() as c:  # and the server's own view agrees that nothing leaked
        assert c.get("/get_server_info").json()["integrity_ok"] is True


def test_cache_tree_token_ids_and_where(events_server: tuple[Server, str, str]) -> None:
    server, _, _ = events_server
    with server.client() as c:
        c.post("/generate", json={"input_ids": list(range(10, 50)), "sampling_params": GREEDY})
        tree = c.get("/cache_tree", params={"token_ids": True}).json()["tree"]
        plain = c.get("/cache_tree").json()["tree"]
    node = next(n for n in tree["nodes"] if n["token_ids"] and n["token_ids"][0] == 10)
    assert node["token_ids"] == list(range(10, 10 + node["num_tokens"]))
    assert node["where"] in ("D", "DT")
    assert all("token_ids" not in n for n in plain["nodes"])


def test_bad_kv_events_config_exits_2(api_model_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "radixserve", "serve", "--model", str(api_model_dir)]
    cmd += ["--kv-events-config", '{"publisher": "zmq", "endpoint": "http://x"}']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "not a zmq endpoint" in done.stderr


@pytest.mark.slow  # a server of its own, for one exit
def test_a_taken_events_port_stops_the_server_with_the_reason(
    api_model_dir: Path, tmp_path: Path
) -> None:
    taken = zmq.Context()
    try:
        sock = taken.socket(zmq.PUB)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "bind": True}
        cmd = [sys.executable, "-m", "radixserve", "serve", "--model", str(api_model_dir)]
        cmd += ["--port", str(free_port()), "--kv-events-config", json.dumps(config)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        taken.destroy(linger=0)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "cannot open" in done.stderr and "the server could not start" in done.stderr
