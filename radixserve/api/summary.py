"""A conversation summarized by the served model, for compaction on either door (OpenAI's
Responses: ``api/responses/compaction.py``; Anthropic's Messages: ``api/anthropic/protocol.py``):
the conversation, then a user message asking for a summary to continue from (:data:`PROMPT`, or
the client's own instructions), run through the chat pipeline as any request, so its prefix is
the conversation's, a radix hit. A summary takes at most :func:`summary_tokens` unless the
request says otherwise; sent back, it renders as a user message that gives it (:data:`PREFACE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from radixserve.api import turns
from radixserve.api.openai.chat import ChatServing
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.streaming import collect_all
from radixserve.server.result import RequestResult

PROMPT = (
    "Write a summary of this conversation so far, for yourself to continue from it: the task "
    "and what the user asked, what was done and found (tool results included), the decisions "
    "made, and what is left to do. Keep every detail needed to go on; leave out the rest."
)
PREFACE = "A summary of the conversation so far, to continue from:\n\n"
SUMMARY_MAX_TOKENS = 4096  # and a quarter of the context at most: a summary is to shrink it
# what a summary request leaves out of the conversation's: it writes text, not calls or a format
PLAIN = dict.fromkeys(("tools", "tool_choice", "response_format", "regex", "json_schema", "ebnf"))


def ask(instructions: str | None = None) -> dict[str, Any]:
    """The user message that asks for the summary (``instructions``: the client's own)."""
    return {"role": "user", "content": (instructions or "").strip() or PROMPT}


def told(summary: str) -> dict[str, Any]:
    """A summary sent back, as the chat message it renders as."""
    return {"role": "user", "content": PREFACE + summary}


def summary_tokens(context_len: int, budget: int) -> int:
    """How many tokens a summary may take, where the request sets none: a quarter of the
    context, at most :data:`SUMMARY_MAX_TOKENS`, within what the context leaves (``budget``)."""
    return max(1, min(context_len // 4, SUMMARY_MAX_TOKENS, budget))


@dataclass(frozen=True, slots=True)
class Summary:
    text: str  # what the model wrote, without its thinking
    result: RequestResult  # its run's (usage)
    model: str  # the served model (or adapter) that wrote it


async def summarize(
    chat: ChatServing,
    request: ChatCompletionRequest,
    raw: Request,
    prompt: list[int] | None = None,
    max_tokens: int | None = None,
) -> Summary:
    """The summary the model writes for ``request``, whose messages end on :func:`ask`, run
    without its tools or format (:data:`PLAIN`); ``prompt``: its ids where rendered already
    (so, without them); ``max_tokens`` None: :func:`summary_tokens`. A conversation that
    leaves the summary no room in the context loses turns from its middle first
    (``api/turns.py``): compaction is what one past the context needs."""
    request = request.model_copy(update=PLAIN)
    context_len = chat.tm.info.max_context_len
    room = max_tokens or summary_tokens(context_len, context_len)
    messages = list(request.messages)

    async def attempt(kept: list[Any]) -> tuple[bool, tuple[ChatCompletionRequest, list[int]]]:
        whole = len(kept) == len(messages)
        shorter = request if whole else request.model_copy(update={"messages": kept})
        ids = prompt if whole and prompt is not None else await chat.prompt_ids(shorter, raw.state)
        return len(ids) + room <= context_len, (shorter, ids)

    request, ids = await turns.fewest_dropped(messages, attempt)
    if max_tokens is None:
        budget = chat.tm.validator.output_budget(len(ids))
        max_tokens = summary_tokens(context_len, budget)
    update = {"max_tokens": max_tokens, "max_completion_tokens": None, "logprobs": False}
    request = request.model_copy(update=update)
    call = await chat.open(request, raw, ids)
    results = await collect_all(call.group, call.requests)
    answer = chat.response(call.base_id, request, call.plan, call.requests, results)
    text = answer.choices[0].message.content or ""
    return Summary(text, results[0], chat.served_name(call.requests))
