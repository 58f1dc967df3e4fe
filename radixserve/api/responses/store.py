"""Stored responses (``store: true``, OpenAI's default), for ``previous_response_id`` and
``GET`` / ``DELETE /v1/responses/{id}`` and its input items.

Each tenant's responses are its own: the store is keyed by ``(tenant, id)``, so another
tenant's id is a 404 like an unknown one. The store is bounded (``--max-stored-responses``),
the least recently used going first. A stored response keeps its conversation (the chat
messages before it, its instructions aside, and its own output as the assistant's turn), so a
chained request renders the same prefix again: a radix-cache hit.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as it was returned
    conversation: list[dict[str, Any]]  # chat messages up to and including its output
    items: list[dict[str, Any]]  # its input items as listed, the chain's before them (items.py)


class ResponseStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: collections.OrderedDict[tuple[str | None, str], StoredResponse] = (
            collections.OrderedDict()
        )

    def put(self, tenant: str | None, response: StoredResponse) -> None:
        key = (tenant, response.body["id"])
        self._items[key] = response
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        key = (tenant, response_id)
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def delete(self, tenant: str | None, response_id: str) -> bool:
        return self._items.pop((tenant, response_id), None) is not None
