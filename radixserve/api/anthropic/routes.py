"""Anthropic's Messages API: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (a
tenant's), a thin door onto the chat pipeline (``api/anthropic/protocol.py`` converts the body,
``api/anthropic/messages.py`` the result). Errors under ``/v1/messages`` take Anthropic's shape
(:data:`ERROR_PREFIX`)."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixserve.api import summary
from radixserve.api.access.routes import Access, declare
from radixserve.api.access.tenants import Tenants
from radixserve.api.anthropic import clearing, messages, threads
from radixserve.api.anthropic.protocol import (
    CompactionBlock,
    CountTokensRequest,
    Message,
    MessagesRequest,
)
from radixserve.api.anthropic.threads import ThreadStore
from radixserve.api.errors import conversion_error
from radixserve.api.formats.reasoning import ReasoningStream
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.openapi import NOT_FOUND
from radixserve.api.responses.peers import StatePeers
from radixserve.api.streaming import SSEResponse, collect_all, event_stream

ERROR_PREFIX = "/v1/messages"


def anthropic_router(
    chat: ChatServing, tenants: Tenants, held: ThreadStore, peers: StatePeers
) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages", responses=NOT_FOUND)
    async def create_message(body: MessagesRequest, raw: Request) -> Response:
        tenant = tenants.scope(raw.state)
        body, from_thread = threads.resume(held, tenant, body)
        answer_id = peers.new_id("msg") if body.thread else messages.message_id()
        done = partial(threads.hold, held, tenant, body, from_thread, answer_id)
        edited = await clearing.apply(body, _counter(chat, raw.state))
        reply = messages.Reply(id=answer_id, managed=_managed(body, edited), done=done)
        body, prompt = edited.body, edited.prompt
        request = _to_chat(body)
        edit, compacting = body.compact_edit(), body.compaction is not None
        if edit is not None:
            prompt = prompt if prompt is not None else await chat.prompt_ids(request, raw.state)
            compacting = compacting or len(prompt) > edit.threshold()
        if compacting:
            source = body.compaction or edit
            asked = source.instructions if source is not None else None
            written = await summary.summarize(chat, _asking(body, asked), raw)
            if body.compaction is not None or (edit and edit.pause_after_compaction):
                reply.model = written.model
                if body.stream:
                    return SSEResponse(
                        messages.compacted_stream(written.text, written.result, reply)
                    )
                return JSONResponse(messages.compacted(written.text, written.result, reply))
            reply.lead = [messages.compaction(written.text)]
            block = CompactionBlock(type="compaction", content=written.text)
            compacted = [Message(role="assistant", content=[block])]
            request, prompt = _to_chat(body.model_copy(update={"messages": compacted})), None
        call = await chat.open(request, raw, prompt)
        reply.model = chat.served_name(call.requests)
        if body.stream:
            split = ReasoningStream(chat.reasoner(request))
            events = messages.stream(call, split, reply)
            return event_stream(call.group, events, messages.error_event, done=None)
        results = await collect_all(call.group, call.requests)
        response = chat.response(call.base_id, request, call.plan, call.requests, results)
        return JSONResponse(messages.message(response, results[0], reply))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, raw: Request) -> dict[str, Any]:
        """The prompt's tokens, as the chat template renders the conversation and tools after
        the clearing edits (with them, ``context_management.original_input_tokens``: before)."""
        count = _counter(chat, raw.state)
        whole = MessagesRequest(**body.model_dump(exclude_none=True, by_alias=True), max_tokens=1)
        edited = await clearing.apply(whole, count)
        prompt = edited.prompt if edited.prompt is not None else await count(whole)
        out: dict[str, Any] = {"input_tokens": len(prompt)}
        if edited.original_tokens is not None:
            out["context_management"] = {"original_input_tokens": edited.original_tokens}
        return out

    return declare(router, Access.TENANT)


def _asking(body: MessagesRequest, instructions: str | None) -> ChatCompletionRequest:
    """The request for the conversation's summary: the conversation, then the ask."""
    messages = [*body.chat_messages(), summary.ask(instructions)]
    fields = {"model": body.model, "messages": messages, "max_tokens": 1, **body.chat_fields()}
    sampling = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
    fields |= {name: value for name, value in sampling.items() if value is not None}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValueError as exc:
        raise conversion_error(exc) from None


def _counter(chat: ChatServing, state: Any) -> clearing.Count:
    """The prompt ids of a body, as this door renders it for the caller of ``state``."""

    async def count(body: MessagesRequest) -> list[int]:
        return await chat.prompt_ids(_to_chat(body), state)

    return count


def _managed(body: MessagesRequest, edited: clearing.Edited) -> dict[str, Any] | None:
    """The response's ``context_management`` (None where the request gave none)."""
    return None if body.context_management is None else {"applied_edits": edited.applied}


def _to_chat(body: MessagesRequest) -> ChatCompletionRequest:
    """The body in the chat route's words; a 400 naming what the chat route refuses."""
    try:
        return body.to_chat()
    except ValueError as exc:  # pydantic's ValidationError included
        raise conversion_error(exc) from None
