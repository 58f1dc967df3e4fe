"""A Responses body as the chat route's request, and OpenAI's ``truncation: auto``: a
conversation whose prompt leaves its output no room in the context loses turns from its middle
until it does, so a long-running agent goes on instead of getting a 400.

What is kept (``api/turns.py``): ``instructions``, the messages up to the first user message
(the task) and the latest turns; the fewest turns are dropped, each try rendered through the
template. A conversation that does not fit even as its last turn is left whole, to be refused
with its length as any other. ``disabled`` (OpenAI's default) changes nothing. The stored conversation
stays whole: each request truncates for itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from radixserve.api import turns
from radixserve.api.errors import conversion_error
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.responses.protocol import ResponsesRequest

T = TypeVar("T")
_Rendered = tuple[ChatCompletionRequest, list[int]]  # a request and its prompt's ids


async def chat_request(
    chat: ChatServing, body: ResponsesRequest, history: list[dict[str, Any]], state: Any
) -> tuple[ChatCompletionRequest, list[int] | None]:
    """``body`` after ``history`` (chat messages) as the chat route's request, truncated as
    ``body.truncation`` says, and its prompt's ids where truncating rendered them (None: not
    rendered yet; ``ChatServing.open`` takes them, so no prompt is rendered twice); a 400 for
    input no chat can render. ``state``: the caller's, as its guard left it."""
    messages = [*history, *_convert(body.input_messages)]
    request = _convert(body.to_chat, messages)
    if body.truncation != "auto":
        return request, None

    async def attempt(kept: list[dict[str, Any]]) -> tuple[bool, _Rendered]:
        shorter = request if len(kept) == len(messages) else _convert(body.to_chat, kept)
        ids = await chat.prompt_ids(shorter, state)
        return _fits(chat, body, ids), (shorter, ids)

    request, ids = await turns.fewest_dropped(messages, attempt)
    return request, ids


def _fits(chat: ChatServing, body: ResponsesRequest, ids: list[int]) -> bool:
    return len(ids) + (body.max_output_tokens or 1) <= chat.tm.info.max_context_len


def _convert(make: Callable[..., T], *args: Any) -> T:
    """``make(*args)``; a 400 naming the input where it cannot be converted."""
    try:
        return make(*args)
    except (ValueError, KeyError) as exc:  # pydantic's ValidationError included
        raise conversion_error(exc, "input: ") from None
