"""``api/responses/peers.py``: a data-parallel worker forwards a request that names another
worker's stored response or conversation to that worker, as it came (its key, its body, its
query) and streams the answer back; a request naming its own, none, or forwarded once already
is its own to serve; an unreachable owner is a 503. The owner here is a small app behind
httpx's ASGI transport; the whole path over real workers and SGLang's routers is in
``test_data_parallel.py``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from radixserve.api.responses.peers import ForwardToOwner, StatePeers

pytestmark = pytest.mark.timeout(60)
PEERS = StatePeers(("http://w0", "http://w1"), rank=0)


def _echo(who: str) -> FastAPI:
    """An app that says who answered and what it got; ``/stream`` answers in pieces."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE"])
    async def echo(path: str, request: Request) -> Any:
        seen = {
            "who": who,
            "path": path,
            "query": str(request.query_params),
            "body": (await request.body()).decode(),
            "key": request.headers.get("authorization"),
            "forwarded": request.headers.get("x-radixserve-forwarded"),
        }
        if path.endswith("stream"):
            pieces = (f"data: {k}\n\n".encode() for k in range(3))
            return StreamingResponse(pieces, media_type="text/event-stream")
        return seen

    return app


def _client(owner: FastAPI | None = None) -> TestClient:
    transport = httpx.ASGITransport(app=owner) if owner is not None else None
    return TestClient(ForwardToOwner(_echo("here"), PEERS, transport=transport))


def test_ids_name_their_worker_where_there_are_peers() -> None:
    assert PEERS.new_id("resp").startswith("resp_w0_")
    assert StatePeers(PEERS.urls, rank=1).new_id("conv").startswith("conv_w1_")
    alone = StatePeers()
    assert alone.new_id("resp").startswith("resp_") and alone.owner("resp_w1_x") is None
    assert PEERS.owner("resp_w1_abc") == "http://w1"
    assert PEERS.owner("msg_w1_abc") == "http://w1"  # an Anthropic thread's
    for own_or_none in ("resp_w0_abc", "resp_w7_abc", "resp_abc", "msg_abc", None, 3):
        assert PEERS.owner(own_or_none) is None


def test_a_request_naming_another_workers_object_is_served_there() -> None:
    client = _client(_echo("owner"))
    key = {"Authorization": "Bearer tenant-key"}
    got = client.get("/v1/responses/resp_w1_abc/input_items?limit=2", headers=key).json()
    assert (got["who"], got["path"], got["query"]) == (
        "owner",
        "v1/responses/resp_w1_abc/input_items",
        "limit=2",
    )
    assert (got["key"], got["forwarded"]) == ("Bearer tenant-key", "1")  # the owner checks the key
    for body in (
        {"previous_response_id": "resp_w1_abc", "input": "hi"},
        {"conversation": "conv_w1_abc", "input": "hi"},
        {"conversation": {"id": "conv_w1_abc"}, "input": "hi"},
    ):
        got = client.post("/v1/responses", json=body).json()
        assert got["who"] == "owner" and json.loads(got["body"]) == body
    thread = {"type": "continue", "previous_message_id": "msg_w1_abc"}
    got = client.post("/v1/messages", json={"thread": thread, "messages": []}).json()
    assert got["who"] == "owner" and json.loads(got["body"])["thread"] == thread
    chained = {"previous_response_id": "resp_w1_abc", "input": "hi"}
    for path in ("/v1/responses/input_tokens", "/v1/responses/compact"):
        got = client.post(path, json=chained).json()
        assert (got["who"], "/" + got["path"]) == ("owner", path)
    got = client.post("/v1/conversations/conv_w1_abc/items", json={"items": []}).json()
    assert got["who"] == "owner" and got["body"] == '{"items":[]}'
    assert client.delete("/v1/conversations/conv_w1_abc").json()["who"] == "owner"
    streamed = client.get("/v1/responses/resp_w1_stream")
    assert streamed.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert streamed.headers["content-type"].startswith("text/event-stream")


def test_its_own_none_or_forwarded_once_is_served_here() -> None:
    client = _client(_echo("owner"))
    assert client.get("/v1/responses/resp_w0_abc").json()["who"] == "here"
    assert client.post("/v1/responses", json={"input": "hi"}).json()["who"] == "here"
    body = {"previous_response_id": "resp_w0_abc", "input": "hi"}
    got = client.post("/v1/responses", json=body).json()
    assert got["who"] == "here" and json.loads(got["body"]) == body  # the body read is replayed
    assert client.post("/v1/responses", content=b"not json").json()["who"] == "here"
    again = {"x-radixserve-forwarded": "1"}
    assert client.get("/v1/responses/resp_w1_abc", headers=again).json()["who"] == "here"
    assert client.post("/v1/conversations", json={}).json()["who"] == "here"


def test_an_unreachable_owner_is_a_503() -> None:
    peers = StatePeers(("http://127.0.0.1:9", "http://127.0.0.1:9"), rank=0)  # discard: closed
    client = TestClient(ForwardToOwner(_echo("here"), peers))
    answer = client.get("/v1/responses/resp_w1_abc")
    assert answer.status_code == 503
    assert "not reachable" in answer.json()["error"]["message"]


@pytest.mark.parametrize("pause", [0.01, 600.0], ids=["streaming", "silent"])
def test_a_client_that_leaves_a_forwarded_stream_leaves_the_owners_too(pause: float) -> None:
    """The owner's stream is closed when the client goes (its request is then aborted there,
    as a client of its own that left), not run on to its end: an owner on a real socket
    streaming without end (or silent after its first piece, as in a long prefill), a client
    that disconnects after its first piece."""
    import asyncio
    import threading

    import uvicorn
    from serving_harness import free_port

    closed = threading.Event()
    owner = FastAPI()

    @owner.get("/v1/responses/{rid}")
    async def forever(rid: str) -> StreamingResponse:
        async def pieces() -> Any:
            try:
                while True:
                    yield b"data: piece\n\n"
                    await asyncio.sleep(pause)
            finally:
                closed.set()

        return StreamingResponse(pieces(), media_type="text/event-stream")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(owner, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.01)
        peers = StatePeers(("http://127.0.0.1:1", f"http://127.0.0.1:{port}"), rank=0)
        forward = ForwardToOwner(_echo("here"), peers)
        asyncio.run(_leave_after_one_piece(forward))
        assert closed.wait(10), "the owner's stream ran on after the client left"
    finally:
        server.should_exit = True
        thread.join(10)


async def _leave_after_one_piece(forward: ForwardToOwner) -> None:
    import asyncio

    got_piece = asyncio.Event()
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/responses/resp_w1_abc",
        "query_string": b"",
        "headers": [],
    }

    requested = False

    async def receive() -> dict[str, Any]:  # the (empty) request, then the client leaving
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await got_piece.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            got_piece.set()

    await asyncio.wait_for(forward(scope, receive, send), timeout=10)
