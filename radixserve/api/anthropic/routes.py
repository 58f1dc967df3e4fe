"""Anthropic's Messages API: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (a
tenant's), a thin door onto the chat pipeline (``api/anthropic/protocol.py`` converts the body,
``api/anthropic/messages.py`` the result). Errors under ``/v1/messages`` take Anthropic's shape
(:data:`ERROR_PREFIX`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixserve.api.access.routes import Access, declare
from radixserve.api.anthropic import messages
from radixserve.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from radixserve.api.errors import conversion_error
from radixserve.api.formats.reasoning import ReasoningStream
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.openapi import NOT_FOUND
from radixserve.api.streaming import collect_all, event_stream

ERROR_PREFIX = "/v1/messages"


def anthropic_router(chat: ChatServing) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages", responses=NOT_FOUND)
    async def create_message(body: MessagesRequest, raw: Request) -> Response:
        request = _to_chat(body)
        call = await chat.open(request, raw)
        model = chat.served_name(call.requests)
        if body.stream:
            split = ReasoningStream(chat.reasoner(request))
            events = messages.stream(call, split, model)
            return event_stream(call.group, events, messages.error_event, done=None)
        results = await collect_all(call.group, call.requests)
        response = chat.response(call.base_id, request, call.plan, call.requests, results)
        return JSONResponse(messages.message(response, results[0], model))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, raw: Request) -> dict[str, Any]:
        """The prompt's tokens, as the chat template renders the conversation and tools."""
        request = _to_chat(
            MessagesRequest(**body.model_dump(exclude_none=True, by_alias=True), max_tokens=1)
        )
        plan = chat.plan(request, raw.state)
        ids = await chat.render(request, plan)
        return {"input_tokens": len(ids)}

    return declare(router, Access.TENANT)


def _to_chat(body: MessagesRequest) -> ChatCompletionRequest:
    """The body in the chat route's words; a 400 naming what the chat route refuses."""
    try:
        return body.to_chat()
    except ValueError as exc:  # pydantic's ValidationError included
        raise conversion_error(exc) from None
