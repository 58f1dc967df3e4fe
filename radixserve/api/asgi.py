"""What the server's raw ASGI layers share (``access/guard.py``, ``responses/peers.py``): a body
read ahead of the app replayed to it, and a JSON answer sent without the app."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Send


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` first (read already), then the client's own channel
    (disconnect detection)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def send_json(
    send: Send,
    status: int,
    payload: dict[str, Any],
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """``payload`` as a whole JSON response of ``status``."""
    data = json.dumps(payload).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
