"""Anthropic's Messages API: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (a
tenant's), a thin door onto the chat pipeline (``api/anthropic/protocol.py`` converts the body,
``api/anthropic/messages.py`` the result). Errors under ``/v1/messages`` take Anthropic's shape
(:data:`ERROR_PREFIX`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixserve.api import summary
from radixserve.api.access.routes import Access, declare
from radixserve.api.anthropic import messages
from radixserve.api.anthropic.protocol import (
    CompactionBlock,
    CountTokensRequest,
    Message,
    MessagesRequest,
)
from radixserve.api.errors import conversion_error
from radixserve.api.formats.reasoning import ReasoningStream
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.openapi import NOT_FOUND
from radixserve.api.streaming import SSEResponse, collect_all, event_stream
from radixserve.server.result import RequestResult

ERROR_PREFIX = "/v1/messages"


def anthropic_router(chat: ChatServing) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages", responses=NOT_FOUND)
    async def create_message(body: MessagesRequest, raw: Request) -> Response:
        request, prompt = _to_chat(body), None
        lead: list[dict[str, Any]] = []  # a compaction made before the answer
        edit, trigger = body.compact_edit() or {}, body.compact_trigger()
        compacting = body.compaction is not None
        if trigger is not None:
            prompt = await chat.prompt_ids(request, raw.state)
            compacting = compacting or len(prompt) > trigger
        if compacting:
            asked = body.compaction.instructions if body.compaction else edit.get("instructions")
            written = await summary.summarize(chat, _asking(body, asked), raw)
            if body.compaction is not None or edit.get("pause_after_compaction"):
                if body.stream:
                    return SSEResponse(messages.compacted_stream(*_parts(written)))
                return JSONResponse(messages.compacted(*_parts(written)))
            lead = [messages.compaction(written.text)]
            block = CompactionBlock(type="compaction", content=written.text)
            compacted = [Message(role="assistant", content=[block])]
            request, prompt = _to_chat(body.model_copy(update={"messages": compacted})), None
        call = await chat.open(request, raw, prompt)
        model = chat.served_name(call.requests)
        if body.stream:
            split = ReasoningStream(chat.reasoner(request))
            events = messages.stream(call, split, model, lead)
            return event_stream(call.group, events, messages.error_event, done=None)
        results = await collect_all(call.group, call.requests)
        response = chat.response(call.base_id, request, call.plan, call.requests, results)
        return JSONResponse(messages.message(response, results[0], model, lead))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, raw: Request) -> dict[str, Any]:
        """The prompt's tokens, as the chat template renders the conversation and tools."""
        request = _to_chat(
            MessagesRequest(**body.model_dump(exclude_none=True, by_alias=True), max_tokens=1)
        )
        return {"input_tokens": len(await chat.prompt_ids(request, raw.state))}

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


def _parts(written: summary.Summary) -> tuple[str, RequestResult, str]:
    return written.text, written.result, written.model


def _to_chat(body: MessagesRequest) -> ChatCompletionRequest:
    """The body in the chat route's words; a 400 naming what the chat route refuses."""
    try:
        return body.to_chat()
    except ValueError as exc:  # pydantic's ValidationError included
        raise conversion_error(exc) from None
