"""What the Responses API keeps between requests: stored responses (``store: true``, OpenAI's
default), for ``previous_response_id``, ``GET`` / ``DELETE /v1/responses/{id}`` and its input
items, and conversations (``/v1/conversations``), whose items a response given
``conversation`` renders before its input and then adds its input and output to.

Each tenant's objects are its own: a store is keyed by ``(tenant, id)``, so another tenant's
id is a 404 like an unknown one. Each store is bounded (``--max-stored-responses``), the least
recently used going first. A stored response keeps its conversation (the chat messages before
it, its instructions aside, and its own output as the assistant's turn), so a chained request
renders the same prefix again: a radix-cache hit. The lists share their items (references,
not copies) with the response or conversation they were taken from.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as it was returned
    conversation: list[dict[str, Any]]  # chat messages up to and including its output
    items: list[dict[str, Any]]  # its input items as listed, the context's before them


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[dict[str, Any]] = field(default_factory=list)  # as listed (``items.py``)

    def resource(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }


class TenantStore(Generic[T]):
    """Objects by ``(tenant, id)``, at most ``capacity`` of them, least recently used out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[tuple[str | None, str], T] = collections.OrderedDict()

    def put(self, tenant: str | None, key: str, value: T) -> None:
        self._items[(tenant, key)] = value
        self._items.move_to_end((tenant, key))
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, tenant: str | None, key: str) -> T | None:
        found = self._items.get((tenant, key))
        if found is not None:
            self._items.move_to_end((tenant, key))
        return found

    def delete(self, tenant: str | None, key: str) -> bool:
        return self._items.pop((tenant, key), None) is not None


class ResponseStore(TenantStore[StoredResponse]):
    pass


class ConversationStore(TenantStore[Conversation]):
    pass
