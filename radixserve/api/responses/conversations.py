"""OpenAI's Conversations API (``/v1/conversations``): a tenant's conversations and their
items. A response given ``conversation`` renders the conversation's items before its input and,
once done, adds its input and output items to it (``routes.py``), so the next turn needs only
its new items and renders the same prefix again: a radix hit. What OpenAI's Agents SDK's
``OpenAIConversationsSession`` and ``Runner.run(conversation_id=...)`` call.

- ``POST /v1/conversations`` (``items``, at most 20; ``metadata``), ``GET``, ``POST`` (its
  metadata) and ``DELETE /v1/conversations/{id}``;
- ``POST /v1/conversations/{id}/items`` (at most 20 a call), ``GET`` (a page: ``after``,
  ``limit``, ``order``, newest first by default), ``GET`` and ``DELETE .../items/{item_id}``.

Items are checked as a response's input is (a type the chat route cannot render is a 400)
when they are added, and listed as ``GET /v1/responses/{id}/input_items`` lists them.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from radixserve.api.access.routes import Access, declare
from radixserve.api.access.tenants import Tenants
from radixserve.api.errors import APIError, conversion_error
from radixserve.api.openapi import NOT_FOUND
from radixserve.api.responses import items
from radixserve.api.responses.peers import StatePeers
from radixserve.api.responses.protocol import items_messages
from radixserve.api.responses.store import Conversation, ConversationStore, json_bytes

MAX_ITEMS_PER_CALL = 20  # OpenAI's
MAX_METADATA = (16, 64, 512)  # OpenAI's: pairs, a key's characters, a value's


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("metadata", check_fields=False)
    @classmethod
    def _bounded(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        pairs, key_len, value_len = MAX_METADATA
        if value is not None and (
            len(value) > pairs
            or any(len(k) > key_len or len(v) > value_len for k, v in value.items())
        ):
            raise ValueError(
                f"metadata holds at most {pairs} pairs, keys of at most {key_len} characters"
                f" and values of at most {value_len}"
            )
        return value


class CreateConversation(_Metadata):
    items: list[dict[str, Any]] | None = Field(None, max_length=MAX_ITEMS_PER_CALL)
    metadata: dict[str, str] | None = None


class UpdateConversation(_Metadata):
    metadata: dict[str, str] | None


class CreateItems(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)


def conversations_router(
    tenants: Tenants, store: ConversationStore, peers: StatePeers
) -> APIRouter:
    router = APIRouter()

    def found(raw: Request, conversation_id: str) -> Conversation:
        return store.find(tenants.scope(raw.state), conversation_id)

    def grow(
        raw: Request, conversation: Conversation, given: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``given`` items added to ``conversation`` as listed; a 400 for an item no response
        could render, or past the conversation's bounds."""
        try:
            items_messages(given)
            added = items.input_items(given)
            size = json_bytes(added)
            store.check_room(conversation, len(added), size)
        except (ValueError, KeyError) as exc:
            raise conversion_error(exc, "items: ") from None
        store.grow(tenants.scope(raw.state), conversation, added, size)
        return added

    def item_at(conversation: Conversation, item_id: str) -> int:
        for at, item in enumerate(conversation.items):
            if item["id"] == item_id:
                return at
        raise APIError(f"no item {item_id!r} in this conversation", 404, code="not_found")

    @router.post("/v1/conversations")
    async def create(body: CreateConversation, raw: Request) -> dict[str, Any]:
        conversation = Conversation(peers.new_id("conv"), int(time.time()), body.metadata or {})
        grow(raw, conversation, body.items or [])
        store.put(tenants.scope(raw.state), conversation.id, conversation, conversation.size)
        return conversation.resource()

    @router.get("/v1/conversations/{conversation_id}", responses=NOT_FOUND)
    async def retrieve(conversation_id: str, raw: Request) -> dict[str, Any]:
        return found(raw, conversation_id).resource()

    @router.post("/v1/conversations/{conversation_id}", responses=NOT_FOUND)
    async def update(
        conversation_id: str, body: UpdateConversation, raw: Request
    ) -> dict[str, Any]:
        conversation = found(raw, conversation_id)
        conversation.metadata = body.metadata or {}
        return conversation.resource()

    @router.delete("/v1/conversations/{conversation_id}", responses=NOT_FOUND)
    async def delete(conversation_id: str, raw: Request) -> dict[str, Any]:
        found(raw, conversation_id)
        store.delete(tenants.scope(raw.state), conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @router.post("/v1/conversations/{conversation_id}/items", responses=NOT_FOUND)
    async def add_items(
        conversation_id: str,
        body: CreateItems,
        raw: Request,
        include: list[str] | None = Query(None),  # nothing more to include here
    ) -> dict[str, Any]:
        added = grow(raw, found(raw, conversation_id), body.items)
        return items.page(added, None, len(added), "asc")

    @router.get("/v1/conversations/{conversation_id}/items", responses=NOT_FOUND)
    async def list_items(
        conversation_id: str, raw: Request, query: Annotated[items.PageQuery, Depends()]
    ) -> dict[str, Any]:
        return query.page(found(raw, conversation_id).items)

    @router.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=NOT_FOUND)
    async def retrieve_item(conversation_id: str, item_id: str, raw: Request) -> dict[str, Any]:
        conversation = found(raw, conversation_id)
        return conversation.items[item_at(conversation, item_id)]

    @router.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=NOT_FOUND)
    async def delete_item(conversation_id: str, item_id: str, raw: Request) -> dict[str, Any]:
        conversation = found(raw, conversation_id)
        store.remove(tenants.scope(raw.state), conversation, item_at(conversation, item_id))
        return conversation.resource()

    return declare(router, Access.TENANT)
