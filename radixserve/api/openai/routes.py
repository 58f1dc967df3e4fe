"""OpenAI's routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` (a tenant's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from radixserve.api.access.routes import Access, declare
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

    @router.get("/v1/models", responses=ok_body(ModelList))
    async def v1_models() -> dict[str, Any]:
        """The base model, then every LoRA adapter with the base as its ``parent`` (vLLM's)."""
        ctx = tm.info.max_context_len
        card = ModelCard(
            id=config.model_name,
            root=config.engine.model_path,
            max_model_len=ctx,
            description=DEFAULT_MODEL_DESCRIPTION if config.is_default_model else None,
            is_smoke_test_model=config.is_default_model,
        )
        adapters = [
            ModelCard(id=name, root=path, parent=config.model_name, max_model_len=ctx)
            for name, path in sorted(tm.lora_adapters.items())
        ]
        return dump(ModelList(data=[card, *adapters]))

    return declare(router, Access.TENANT)
