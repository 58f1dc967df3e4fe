"""OpenAI's routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` and
``/v1/models/{model}`` (a tenant's; cards that OpenAI's and Anthropic's clients both read)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixserve.api.access.routes import Access, declare
from radixserve.api.adapters import adapter_of_model
from radixserve.api.errors import APIError
from radixserve.api.openai.bodies import (
    ChatCompletionResponse,
    CompletionResponse,
    ModelCard,
    ModelList,
    dump,
)
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.completions import CompletionServing
from radixserve.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixserve.api.openapi import NOT_FOUND, ok_body
from radixserve.config import ServerConfig
from radixserve.runtime.default_model import DESCRIPTION as DEFAULT_MODEL_DESCRIPTION
from radixserve.server.tokenizer_manager import TokenizerManager


def openai_router(tm: TokenizerManager, config: ServerConfig, chat: ChatServing) -> APIRouter:
    router = APIRouter()
    completions = CompletionServing(tm, config)

    @router.post("/v1/completions", responses={**ok_body(CompletionResponse, True), **NOT_FOUND})
    async def v1_completions(body: CompletionRequest, raw: Request) -> Response:
        return await completions.create(body, raw)

    @router.post(
        "/v1/chat/completions", responses={**ok_body(ChatCompletionResponse, True), **NOT_FOUND}
    )
    async def v1_chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await chat.create(body, raw)

    started = int(time.time())

    def cards() -> list[ModelCard]:
        """The base model, then every LoRA adapter with the base as its ``parent`` (vLLM's)."""
        ctx = tm.info.max_context_len
        card = ModelCard(
            id=config.model_name,
            created=started,
            root=config.engine.model_path,
            max_model_len=ctx,
            description=DEFAULT_MODEL_DESCRIPTION if config.is_default_model else None,
            is_smoke_test_model=config.is_default_model,
        )
        adapters = [
            ModelCard(
                id=name, created=started, root=path, parent=config.model_name, max_model_len=ctx
            )
            for name, path in sorted(tm.lora_adapters.items())
        ]
        return [card, *adapters]

    @router.get("/v1/models", responses=ok_body(ModelList))
    async def v1_models() -> dict[str, Any]:
        return dump(ModelList(data=cards()))

    @router.get("/v1/models/{model:path}", responses={**ok_body(ModelCard), **NOT_FOUND})
    async def v1_model(model: str) -> dict[str, Any]:
        """One of the list's cards, by its id or any name a request's ``model`` may give it."""
        listed = {card.id: card for card in cards()}
        name = adapter_of_model(tm, model, chat.accepted_names, config.model_name)
        card = listed.get(config.model_name if name is None else name)
        if card is None:  # an adapter unloaded meanwhile
            raise APIError(f"the model `{model}` does not exist", 404, code="model_not_found")
        return dump(card)

    return declare(router, Access.TENANT)
