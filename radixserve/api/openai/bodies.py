"""Response bodies of the OpenAI routes (non-streaming and streaming chunks) and /v1/models."""

from __future__ import annotations

import datetime
import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs object."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # the thinking, with --reasoning-parser
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's shape (ParsedCall.to_openai)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # with each call's ``index``


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    """A served model as OpenAI's ``Model`` and Anthropic's ``ModelInfo`` both read it: each
    client takes its own fields and ignores the other's."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "radixserve"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None = None
    description: str | None = None
    is_smoke_test_model: bool = False
    # Anthropic's
    type: Literal["model"] = "model"
    display_name: str = ""
    created_at: str = ""  # RFC 3339, of ``created``
    lifecycle: Literal["active"] = "active"
    max_input_tokens: int | None = None
    max_tokens: int | None = None

    @model_validator(mode="after")
    def _anthropic_fields(self) -> ModelCard:
        self.display_name = self.display_name or self.id
        self.created_at = self.created_at or _rfc3339(self.created)
        self.max_input_tokens = self.max_input_tokens or self.max_model_len
        self.max_tokens = self.max_tokens or self.max_model_len
        return self


class ModelList(BaseModel):
    """OpenAI's list, with the cursor fields of Anthropic's page (one page: no more)."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    @model_validator(mode="after")
    def _cursor(self) -> ModelList:
        if self.data:
            self.first_id, self.last_id = self.data[0].id, self.data[-1].id
        return self


def _rfc3339(seconds: int) -> str:
    return (
        datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        .isoformat()
        .replace("+00:00", "Z")
    )


def dump(model: BaseModel) -> dict[str, Any]:
    """A response model as JSON-ready data (``None`` kept: OpenAI sends explicit nulls)."""
    return model.model_dump(mode="json")
