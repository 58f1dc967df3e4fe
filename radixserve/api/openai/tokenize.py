"""``/tokenize`` and ``/detokenize`` (a tenant's), in the shape both vLLM and SGLang serve.

``POST /tokenize``: ``{"prompt": str | [str]}`` (SGLang and vLLM; a list is SGLang's batch) or
``{"messages": [...]}`` (vLLM: through the chat template, ``add_generation_prompt`` true by
default; vLLM's ``tools`` and ``chat_template_kwargs`` rendered as the chat route renders
them), with ``add_special_tokens`` (default true for a prompt; with messages only false: the
template writes any BOS) -> ``{"tokens", "count", "max_model_len"}``; a batch's ``tokens`` and
``count`` are lists. ``POST /detokenize``: ``{"tokens": [int] | [[int]]}`` -> ``{"prompt",
"text"}``, the same string under vLLM's name and SGLang's. No model runs: both are the HTTP
process's tokenizer, the one every generation route uses. A bad body is OpenAI's 400.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from radixserve.api.access.routes import Access, declare
from radixserve.api.errors import APIError
from radixserve.api.openai.chat import render_messages
from radixserve.api.openai.protocol import ChatMessage, Tool
from radixserve.server.tokenizer_manager import TokenizerManager


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None  # accepted: one tokenizer serves every model name here
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    tools: list[Tool] | None = None  # with messages: rendered by the template
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: list[int] | list[list[int]]


def tokenize_router(tm: TokenizerManager) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise APIError("give exactly one of prompt and messages", param="prompt")
        if body.messages is None and (body.tools or body.chat_template_kwargs):
            raise APIError("tools and chat_template_kwargs go with messages", param="tools")
        if body.messages is not None:
            rows = [await _messages_ids(tm, body)]
        else:
            special = body.add_special_tokens is not False
            prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt or []
            try:
                rows = [await tm.prompts.tokenize(p, special) for p in prompts]
            except ValueError as exc:  # a text too long for the context, refused untokenized
                raise APIError(str(exc), param="prompt") from None
        batch = isinstance(body.prompt, list)
        out: dict[str, Any] = {
            "tokens": rows if batch else rows[0],
            "count": [len(r) for r in rows] if batch else len(rows[0]),
            "max_model_len": tm.info.max_context_len,
        }
        if body.return_token_strs:
            strs = [[tm.prompts.decode_token(t) for t in r] for r in rows]
            out["token_strs"] = strs if batch else strs[0]
        return out

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        batch = bool(body.tokens) and isinstance(body.tokens[0], list)
        rows: list[list[int]] = body.tokens if batch else [body.tokens]  # type: ignore[assignment, list-item]
        vocab = len(tm.prompts.tokenizer)
        for row in rows:
            for t in row:
                if not 0 <= t < vocab:
                    raise APIError(f"token id {t} is not in [0, {vocab})", param="tokens")
        texts = [tm.prompts.decode(row) for row in rows]
        text: str | list[str] = texts if batch else texts[0]
        return {"prompt": text, "text": text}

    return declare(router, Access.TENANT)


async def _messages_ids(tm: TokenizerManager, body: TokenizeRequest) -> list[int]:
    """The chat template's ids of ``body.messages``, as the chat route renders them (the
    template writes any BOS: ``add_special_tokens`` true is refused)."""
    assert body.messages is not None
    if body.add_special_tokens:
        raise APIError(
            "add_special_tokens with messages is not supported (the chat template writes them)",
            param="add_special_tokens",
        )
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    return list(await render_messages(tm, body, tools, body.chat_template_kwargs))
