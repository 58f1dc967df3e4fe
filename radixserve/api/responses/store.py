"""What the Responses API keeps between requests: stored responses (``store: true``, OpenAI's
default), for ``previous_response_id``, ``GET`` / ``DELETE /v1/responses/{id}`` and its input
items, and conversations (``/v1/conversations``), whose items a response given
``conversation`` renders before its input and then adds its input and output to.

Each tenant's objects are its own: a store is keyed by ``(tenant, id)``, so another tenant's
id is a 404 like an unknown one. Each store is bounded per tenant (``--max-stored-responses``
each), the least recently used going first, and a conversation by its number of items. A stored response keeps its conversation (the chat messages before
it, its instructions aside, and its own output as the assistant's turn), so a chained request
renders the same prefix again: a radix-cache hit. The lists share their items (references,
not copies) with the response or conversation they were taken from.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from radixserve.api.errors import APIError

T = TypeVar("T")
MAX_CONVERSATION_ITEMS = 10_000


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
    """Objects by ``(tenant, id)``: at most ``capacity`` of each tenant's, its least recently
    used out. Each tenant's bound is its own, so what one tenant stores never evicts another's
    (which would let it see another's activity in what of its own is left)."""

    kind = "object"  # what a 404 calls it

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._tenants: dict[str | None, collections.OrderedDict[str, T]] = {}

    def put(self, tenant: str | None, key: str, value: T) -> None:
        own = self._tenants.setdefault(tenant, collections.OrderedDict())
        own[key] = value
        own.move_to_end(key)
        while len(own) > self.capacity:
            own.popitem(last=False)

    def get(self, tenant: str | None, key: str) -> T | None:
        own = self._tenants.get(tenant)
        if own is None or key not in own:
            return None
        own.move_to_end(key)
        return own[key]

    def find(self, tenant: str | None, key: str, param: str | None = None) -> T:
        """:meth:`get`, or a 404 naming ``param``: another tenant's is as unknown as none."""
        found = self.get(tenant, key)
        if found is None:
            raise APIError(f"no {self.kind} {key!r}", 404, param=param, code="not_found")
        return found

    def delete(self, tenant: str | None, key: str) -> bool:
        own = self._tenants.get(tenant)
        return own is not None and own.pop(key, None) is not None


class ResponseStore(TenantStore[StoredResponse]):
    kind = "stored response"


class ConversationStore(TenantStore[Conversation]):
    """Conversations, each of at most ``max_items`` items: adding past it is refused (a
    conversation grows in place, so the count bound alone would not bound it)."""

    kind = "conversation"

    def __init__(self, capacity: int, max_items: int = MAX_CONVERSATION_ITEMS) -> None:
        super().__init__(capacity)
        self.max_items = max_items

    def check_room(self, conversation: Conversation, more: int) -> None:
        """``ValueError`` unless ``more`` items fit into ``conversation``."""
        if len(conversation.items) + more > self.max_items:
            raise ValueError(
                f"a conversation holds at most {self.max_items} items; this one holds "
                f"{len(conversation.items)}: start another"
            )
