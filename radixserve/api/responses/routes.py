"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``, ``POST /v1/responses/input_tokens`` and
``POST /v1/responses/compact`` (a tenant's; a stored response is its tenant's alone), a thin
door onto the chat pipeline. A response renders after the one it is chained to
(``previous_response_id``) or a conversation's items (``conversation``: ``conversations.py``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from radixserve.api import summary
from radixserve.api.access.routes import Access, declare
from radixserve.api.access.tenants import Tenants
from radixserve.api.errors import APIError
from radixserve.api.formats.reasoning import ReasoningStream
from radixserve.api.formats.tool_calls import ParsedCall
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.common import choice_logprob_slices
from radixserve.api.openai.protocol import ToolCall
from radixserve.api.openapi import NOT_FOUND
from radixserve.api.responses import compaction, items, render, truncation
from radixserve.api.responses.peers import StatePeers
from radixserve.api.responses.protocol import (
    CompactRequest,
    InputTokensRequest,
    ResponsesRequest,
    items_messages,
)
from radixserve.api.responses.store import (
    Conversation,
    ConversationStore,
    ResponseStore,
    StoredResponse,
    json_bytes,
)
from radixserve.api.streaming import collect_all, event_stream, openai_error_event
from radixserve.server.result import RequestResult

logger = logging.getLogger(__name__)


def responses_router(
    chat: ChatServing,
    tenants: Tenants,
    store: ResponseStore,
    conversations: ConversationStore,
    peers: StatePeers,
) -> APIRouter:
    router = APIRouter()

    def stored(raw: Request, response_id: str) -> StoredResponse:
        return store.find(tenants.scope(raw.state), response_id)

    def context(raw: Request, body: ResponsesRequest) -> _Context:
        """What ``body`` renders before its input: the response it is chained to, or the
        conversation it names, or nothing."""
        if body.previous_response_id is not None:
            previous = stored(raw, body.previous_response_id)
            listed = [*previous.items, *previous.body["output"]]
            return _Context(previous.conversation, listed, None)
        cid = body.conversation_id
        if cid is None:
            return _Context([], [], None)
        conversation = conversations.find(tenants.scope(raw.state), cid, "conversation")
        given = list(conversation.items)
        return _Context(items_messages(given), given, conversation)

    async def summarize(
        body: ResponsesRequest,
        before: _Context,
        own: list[dict[str, Any]],
        raw: Request,
        max_tokens: int | None,
    ) -> tuple[list[dict[str, Any]], RequestResult]:
        """The conversation (``before``, then the ``own`` input items) compacted: its user
        messages and a ``compaction`` item of the summary the model writes, at most
        ``max_tokens`` long (None: ``summary.summary_tokens``); and the summary's run."""
        plain = dict.fromkeys(("tools", "tool_choice", "text", "regex", "include", "top_logprobs"))
        asking = body.model_copy(update={**plain, "input": [*own, compaction.ASK]})
        request, prompt = await truncation.chat_request(chat, asking, before.messages, raw.state)
        written = await summary.summarize(chat, request, raw, prompt, max_tokens)
        kept = compaction.user_messages([*before.items, *own])
        return [*kept, compaction.item(written.text, render.new_id("cmp"))], written.result

    @router.post("/v1/responses", responses=NOT_FOUND)
    async def create_response(body: ResponsesRequest, raw: Request) -> Response:
        before = context(raw, body)
        history = before.messages
        request, prompt = await truncation.chat_request(chat, body, history, raw.state)  # 400s
        own = items.input_items(body.input)
        rendered = [*history, *body.input_messages()]  # what the output follows
        lead: list[dict[str, Any]] = []  # the output's first items: a compaction
        threshold = body.compact_threshold(chat.tm.info.max_context_len)
        if threshold is not None:
            if prompt is None:
                prompt = await chat.prompt_ids(request, raw.state)
            if len(prompt) > threshold:
                compacted, _ = await summarize(body, before, own, raw, None)
                lead, rendered = compacted[-1:], items_messages(compacted)
                rest = body.model_copy(update={"input": []})
                request, prompt = await truncation.chat_request(chat, rest, rendered, raw.state)
        own_size = json_bytes(own)  # measured once: up to a whole request body
        tenant = tenants.scope(raw.state)
        if before.conversation is not None:
            try:  # room for its input and an output item
                conversations.check_room(before.conversation, len(own) + 1, own_size)
            except ValueError as exc:
                raise APIError(str(exc), param="conversation") from None
        if body.store and not store.fits(2 * own_size):  # as StoredResponse counts it
            raise APIError(
                f"a tenant's stored responses hold at most {store.max_bytes} bytes and this "
                "input alone is more: send it with store: false",
                param="store",
            )
        call = await chat.open(request, raw, prompt)
        model, response_id = chat.served_name(call.requests), peers.new_id("resp")
        split = ReasoningStream(chat.reasoner(request))

        def keep(final: dict[str, Any]) -> None:
            if before.conversation is not None:
                conversations.grow(tenant, before.conversation, [*own, *final["output"]])
            if body.store:
                turn = _assistant_turn(final["output"][len(lead) :])
                conversation = [*rendered, *turn]
                stored_response = StoredResponse(final, conversation, [*before.items, *own])
                if not store.put(
                    tenant, response_id, stored_response, stored_response.own_bytes(own_size)
                ):
                    logger.warning("a response past --max-stored-bytes with its output: not stored")

        def logprobs(result: RequestResult, start: int) -> list[dict[str, Any]]:
            """The output's tokens' from ``start`` on, as the chat route gives them."""
            if body.logprobs() is None:
                return []
            tokens = chat.chat_logprobs(**choice_logprob_slices(result, start))
            return [token.model_dump() for token in tokens.content]

        if body.stream:
            done: list[dict[str, Any]] = []
            events = render.stream(call, body, split, model, response_id, done, logprobs, lead)
            return event_stream(call.group, _after(events, done, keep), openai_error_event, None)
        results = await collect_all(call.group, call.requests)
        answer = chat.response(call.base_id, request, call.plan, call.requests, results)
        message = answer.choices[0].message
        made = [ToolCall.model_validate(c).function for c in message.tool_calls or []]
        calls = [ParsedCall(f.name, f.arguments) for f in made]  # a custom call's read back
        output = lead + render.output_items(
            message.reasoning_content,
            message.content,
            calls,
            body,
            logprobs(results[0], 0),
            render.was_cut(results[0]),
        )
        final = render.response_body(body, response_id, model, output, results[0])
        keep(final)
        return JSONResponse(final)

    @router.get("/v1/responses/{response_id}", responses=NOT_FOUND)
    async def get_response(response_id: str, raw: Request) -> dict[str, Any]:
        return stored(raw, response_id).body

    @router.get("/v1/responses/{response_id}/input_items", responses=NOT_FOUND)
    async def list_input_items(
        response_id: str, raw: Request, query: Annotated[items.PageQuery, Depends()]
    ) -> dict[str, Any]:
        return query.page(stored(raw, response_id).items)

    @router.post("/v1/responses/input_tokens", responses=NOT_FOUND)
    async def count_input_tokens(body: InputTokensRequest, raw: Request) -> dict[str, Any]:
        """The prompt's tokens, as ``POST /v1/responses`` would render the same body."""
        messages = context(raw, body).messages
        request, ids = await truncation.chat_request(chat, body, messages, raw.state)
        chat.adapter_of(request, request.model)  # a model not served: 404, as the create
        if ids is None:
            ids = await chat.prompt_ids(request, raw.state)
        return {"object": "response.input_tokens", "input_tokens": len(ids)}

    @router.post("/v1/responses/compact", responses=NOT_FOUND)
    async def compact(body: CompactRequest, raw: Request) -> dict[str, Any]:
        """The conversation compacted: its user messages, then one ``compaction`` item holding
        the summary the model writes of it (``compaction.py``). Nothing is stored."""
        if body.stream:
            raise APIError("POST /v1/responses/compact does not stream", param="stream")
        before = context(raw, body)
        own = items.input_items(body.input)
        output, result = await summarize(body, before, own, raw, body.max_output_tokens)
        return {
            "id": render.new_id("resp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": output,
            "usage": render.usage(result),
        }

    @router.delete("/v1/responses/{response_id}", responses=NOT_FOUND)
    async def delete_response(response_id: str, raw: Request) -> dict[str, Any]:
        stored(raw, response_id)
        store.delete(tenants.scope(raw.state), response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    return declare(router, Access.TENANT)


@dataclass(frozen=True)
class _Context:
    messages: list[dict[str, Any]]  # the chat messages before the input
    items: list[dict[str, Any]]  # the same as listed input items
    conversation: Conversation | None  # where the response's items go, if any


async def _after(events: Any, done: list[dict[str, Any]], keep: Any) -> Any:
    async for event in events:
        yield event
    if done:
        keep(done[0])


def _assistant_turn(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a chained request renders after it: one
    assistant turn (empty where the output was)."""
    return items_messages(output) or [{"role": "assistant", "content": None}]
