"""Every body field the installed official clients can send is one this server knows (served,
accepted without effect, or refused by name), so none is an "unknown field" 400: the create
parameters of ``openai`` (chat, completions, Responses, its input-token count, conversations)
and ``anthropic`` (Messages and its count, the beta's too), read from the clients themselves.
A client release that adds a field fails here until the server decides what to do with it."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import message_count_tokens_params as a_count
from anthropic.types import message_create_params as a_create
from anthropic.types.beta import message_count_tokens_params as beta_count
from anthropic.types.beta import message_create_params as beta_create
from openai.types import completion_create_params as completions
from openai.types.chat import completion_create_params as chat
from openai.types.conversations import conversation_create_params as conv_create
from openai.types.conversations import item_create_params as conv_items
from openai.types.responses import input_token_count_params as input_tokens
from openai.types.responses import response_compact_params as compact
from openai.types.responses import response_create_params as responses
from pydantic import BaseModel

from radixserve.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from radixserve.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixserve.api.responses.conversations import CreateConversation, CreateItems
from radixserve.api.responses.protocol import (
    CompactRequest,
    InputTokensRequest,
    ResponsesRequest,
)

HEADERS = {"betas"}  # the anthropic client sends them as a header
QUERY = {"include"}  # conversation items' include: the client sends it in the query

# (the client's parameters, the server's body, what the client sends outside the body)
CASES: list[tuple[Any, type[BaseModel], set[str]]] = [
    (chat.CompletionCreateParamsBase, ChatCompletionRequest, set()),
    (completions.CompletionCreateParamsBase, CompletionRequest, set()),
    (responses.ResponseCreateParamsBase, ResponsesRequest, set()),
    (input_tokens.InputTokenCountParams, InputTokensRequest, set()),
    (compact.ResponseCompactParams, CompactRequest, set()),
    (conv_create.ConversationCreateParams, CreateConversation, set()),
    (conv_items.ItemCreateParams, CreateItems, QUERY),
    (a_create.MessageCreateParamsBase, MessagesRequest, set()),
    (a_count.MessageCountTokensParams, CountTokensRequest, set()),
    (beta_create.MessageCreateParamsBase, MessagesRequest, HEADERS),
    (beta_count.MessageCountTokensParams, CountTokensRequest, HEADERS),
]


def _fields(params: Any) -> set[str]:
    names: set[str] = set()
    for cls in reversed(params.__mro__):
        names |= set(getattr(cls, "__annotations__", {}))
    return names


@pytest.mark.parametrize(
    ("params", "ours", "elsewhere"),
    CASES,
    ids=[f"{p.__module__}.{p.__name__}" for p, _, _ in CASES],
)
def test_every_field_the_client_sends_is_known(
    params: Any, ours: type[BaseModel], elsewhere: set[str]
) -> None:
    unknown = _fields(params) - elsewhere - set(ours.model_fields)
    assert not unknown, f"{params.__name__} sends {sorted(unknown)}, unknown to {ours.__name__}"
