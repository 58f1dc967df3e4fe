"""``--kv-events-config``: SGLang's JSON for the KV event publisher (``KVEventsConfig``).

``{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}`` turns
publishing on (``{"publisher": "zmq"}`` alone binds loopback's port 5557: the events carry the
token ids of every cached prompt, so they are an operator's feed) (``radix.kv_events`` for the events, ``server.kv_event_publisher`` for the
socket); ``"publisher": "null"`` (the default) keeps it off. The fields and defaults are
SGLang 0.5.23's; its ``format`` is accepted as ``"default"`` or ``"dynamo"``, and both publish
namespaced hashes here (see ``radix.kv_events``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"


class KVEventsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    publisher: Literal["null", "zmq"] = "null"
    # the events carry every cached prompt's token ids: by default only this machine may
    # subscribe (an endpoint given is used as given, e.g. tcp://*:5557 for every interface)
    endpoint: str = DEFAULT_ENDPOINT
    bind: bool | None = None  # None: bind a wildcard, ipc:// or inproc:// endpoint, else connect
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    format: Literal["default", "dynamo"] = "default"

    @classmethod
    def from_cli(cls, value: str) -> KVEventsConfig:
        """Parse the JSON; a ``ValueError`` naming what is wrong."""
        try:
            config = cls.model_validate_json(value)
        except ValidationError as exc:
            raise ValueError(f"--kv-events-config: {exc}") from None
        for name in ("endpoint", "replay_endpoint"):
            endpoint = getattr(config, name)
            if endpoint is not None and not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"--kv-events-config: {name} {endpoint!r} is not a zmq endpoint")
        if "endpoint" not in config.model_fields_set and config.bind is None:
            config = config.model_copy(update={"bind": True})  # the loopback default is bound
        if config.buffer_steps < 1 or config.hwm < 0 or config.max_queue_size < 1:
            raise ValueError("--kv-events-config: buffer_steps and max_queue_size must be >= 1")
        return config

    @property
    def enabled(self) -> bool:
        return self.publisher != "null"

    def for_rank(self, rank: int) -> KVEventsConfig:
        """Data-parallel rank ``rank``'s config: SGLang's ``offset_endpoint_port`` (tcp ports
        plus the rank, ``_dp{rank}`` after an inproc name; ipc paths get the suffix too)."""
        return self.model_copy(
            update={
                "endpoint": offset_endpoint(self.endpoint, rank),
                "replay_endpoint": offset_endpoint(self.replay_endpoint, rank),
            }
        )


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"
