"""A server with keys: two tenants (``A``, ``B``), an admin, gRPC and KV events, for the
authorization and isolation tests; each tenant may store :data:`STORED_BYTES` of responses and
as many of conversations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from serving_harness import Server, free_port, serving, write_api_model

from radixserve.api.access.tenants import tenant_of_key

A, B, ADMIN = "tenant-a-key-7f3a", "tenant-b-key-91c2", "admin-key-5d0e"
KEYS = {"a": A, "b": B, "admin": ADMIN}
PADDING = 64  # vocabulary rows past the tokenizer's
STORED_BYTES = 256 << 10


@dataclass
class KeyedServer:
    server: Server
    grpc_port: int
    num_text_tokens: int

    @property
    def url(self) -> str:
        return self.server.url

    def channel(self) -> grpc.Channel:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        return channel


def secrets() -> list[str]:
    """What no response may hold: every key, and each lone key's tenant name (its digest)."""
    return [A, B, ADMIN, tenant_of_key(A), tenant_of_key(B)]


def bearer(who: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"} if who else {}


def keyed_serving(tmp: Path, tokenizer: object) -> Iterator[KeyedServer]:
    num_text_tokens = len(tokenizer)  # type: ignore[arg-type]
    vocab = num_text_tokens + PADDING
    model = write_api_model(tmp / "padded-llama", tokenizer, vocab_size=vocab)
    port = free_port()
    events = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "bind": True}
    args = ["--model", str(model), "--api-key", A, "--api-key", B, "--admin-api-key", ADMIN]
    args += ["--grpc-port", str(port), "--kv-events-config", json.dumps(events)]
    args += ["--max-queued-requests", "4", "--max-total-tokens", "8192"]
    args += ["--max-stored-bytes", str(STORED_BYTES)]
    with serving(args, tmp / "server.log") as server:
        yield KeyedServer(server, port, num_text_tokens)
