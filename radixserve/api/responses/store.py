"""What the Responses API keeps between requests: stored responses (``store: true``, OpenAI's
default), for ``previous_response_id``, ``GET`` / ``DELETE /v1/responses/{id}`` and its input
items, and conversations (``/v1/conversations``), whose items a response given
``conversation`` renders before its input and then adds its input and output to.

Each tenant's objects are its own: a store is keyed by ``(tenant, id)``, so another tenant's
id is a 404 like an unknown one. Each store is bounded per tenant, by count
(``--max-stored-responses``) and by size (``--max-stored-bytes``, each object counted as the
bytes of its JSON that no other object holds), the least recently used going first; a
conversation also by its number of items. A stored response keeps its conversation (the chat
messages before it, its instructions aside, and its own output as the assistant's turn), so a
chained request renders the same prefix again: a radix-cache hit. The lists share their items
(references, not copies) with the response or conversation they were taken from.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from radixserve.api.errors import APIError

T = TypeVar("T")
MAX_CONVERSATION_ITEMS = 10_000
REFERENCE_BYTES = 8  # what a list's entry costs: a shared item is counted once, its entries not


def json_bytes(value: Any) -> int:
    """``value``'s size as its JSON's bytes (what a stored object is counted as)."""
    return len(json.dumps(value, ensure_ascii=False).encode())


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as it was returned
    conversation: list[dict[str, Any]]  # chat messages up to and including its output
    items: list[dict[str, Any]]  # its input items as listed, the context's before them

    def own_bytes(self, new: int) -> int:
        """What it adds to the store, ``new`` the bytes of its own input items (the rest it
        shares with the response it is chained to): those twice (as items and as messages),
        the response object (its output, and the tools it echoes) and its lists' entries."""
        entries = len(self.conversation) + len(self.items)
        return 2 * new + json_bytes(self.body) + REFERENCE_BYTES * entries


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[dict[str, Any]] = field(default_factory=list)  # as listed (``items.py``)
    size: int = 0  # its items' bytes (``json_bytes``), kept by ``ConversationStore.grow``

    def resource(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }


class TenantStore(Generic[T]):
    """Objects by ``(tenant, id)``: at most ``capacity`` of each tenant's and ``max_bytes`` of
    their sizes, its least recently used out. Each tenant's bound is its own, so what one tenant
    stores never evicts another's (which would let it see another's activity in what of its own
    is left)."""

    kind = "object"  # what a 404 calls it

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self.capacity, self.max_bytes = capacity, max_bytes
        self._tenants: dict[str | None, collections.OrderedDict[str, tuple[T, int]]] = {}
        self._bytes: dict[str | None, int] = {}

    def fits(self, size: int) -> bool:
        return size <= self.max_bytes

    def put(self, tenant: str | None, key: str, value: T, size: int = 0) -> bool:
        """Store ``value`` of ``size`` bytes, evicting the tenant's least recently used past
        its bounds; False (and nothing stored) if ``size`` alone is past them."""
        if not self.fits(size):
            return False
        self.delete(tenant, key)
        self._tenants.setdefault(tenant, collections.OrderedDict())[key] = (value, 0)
        self.resize(tenant, key, size)
        return True

    def resize(self, tenant: str | None, key: str, delta: int) -> None:
        """``key``'s object grew by ``delta`` bytes (it is kept, the oldest others go)."""
        own = self._tenants[tenant]
        value, size = own[key]
        own[key] = (value, size + delta)
        own.move_to_end(key)
        self._bytes[tenant] = self._bytes.get(tenant, 0) + delta
        while len(own) > 1 and (len(own) > self.capacity or self._bytes[tenant] > self.max_bytes):
            self._pop(tenant, next(iter(own)))

    def get(self, tenant: str | None, key: str) -> T | None:
        own = self._tenants.get(tenant)
        if own is None or key not in own:
            return None
        own.move_to_end(key)
        return own[key][0]

    def find(self, tenant: str | None, key: str, param: str | None = None) -> T:
        """:meth:`get`, or a 404 naming ``param``: another tenant's is as unknown as none."""
        found = self.get(tenant, key)
        if found is None:
            raise APIError(f"no {self.kind} {key!r}", 404, param=param, code="not_found")
        return found

    def delete(self, tenant: str | None, key: str) -> bool:
        own = self._tenants.get(tenant)
        if own is None or key not in own:
            return False
        self._pop(tenant, key)
        return True

    def stored_bytes(self, tenant: str | None) -> int:
        return self._bytes.get(tenant, 0)

    def _pop(self, tenant: str | None, key: str) -> None:
        _, size = self._tenants[tenant].pop(key)
        self._bytes[tenant] -= size


class ResponseStore(TenantStore[StoredResponse]):
    kind = "stored response"


class ConversationStore(TenantStore[Conversation]):
    """Conversations, each of at most ``max_items`` items and ``max_bytes``: adding past either
    is refused (a conversation grows in place, so the store's bounds alone would not bound
    it)."""

    kind = "conversation"

    def __init__(
        self, capacity: int, max_bytes: int, max_items: int = MAX_CONVERSATION_ITEMS
    ) -> None:
        super().__init__(capacity, max_bytes)
        self.max_items = max_items

    def check_room(self, conversation: Conversation, count: int, size: int) -> None:
        """``ValueError`` unless ``count`` more items of ``size`` bytes (``json_bytes``) fit
        into ``conversation``."""
        if len(conversation.items) + count > self.max_items:
            raise ValueError(
                f"a conversation holds at most {self.max_items} items; this one holds "
                f"{len(conversation.items)}: start another"
            )
        if not self.fits(conversation.size + size):
            raise ValueError(
                f"a conversation holds at most {self.max_bytes} bytes of items; this one holds "
                f"{conversation.size} and these are {size}: start another"
            )

    def grow(
        self,
        tenant: str | None,
        conversation: Conversation,
        items: list[dict[str, Any]],
        size: int | None = None,
    ) -> None:
        """``items`` (of ``size`` bytes, measured here if not given) added to ``conversation``
        (checked by :meth:`check_room`), its size and its tenant's with them while it is
        stored."""
        conversation.items += items
        self._count(tenant, conversation, json_bytes(items) if size is None else size)

    def remove(self, tenant: str | None, conversation: Conversation, at: int) -> None:
        """The item at ``at`` out of ``conversation``, its bytes with it."""
        self._count(tenant, conversation, -json_bytes([conversation.items.pop(at)]))

    def _count(self, tenant: str | None, conversation: Conversation, size: int) -> None:
        conversation.size += size
        if self.get(tenant, conversation.id) is conversation:
            self.resize(tenant, conversation.id, size)
