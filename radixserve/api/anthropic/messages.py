"""The chat pipeline's result in Anthropic's words: a whole ``message``, or its stream of events
(``message_start``, each content block's ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta``, ``message_stop``), and errors in Anthropic's shape.

Content blocks come in the order a model writes them, after a ``compaction`` where the
conversation was compacted first: its ``thinking`` (with
``--reasoning-parser``), its ``text``, then each ``tool_use`` whole (a stream sends a call's
``input`` as one ``input_json_delta`` once the call is parsed). ``usage`` counts the cached part
of the prompt as ``cache_read_input_tokens`` and the rest as ``input_tokens``, as Anthropic
does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from radixserve.api.errors import APIError
from radixserve.api.formats.reasoning import ReasoningStream
from radixserve.api.formats.tool_calls import ParsedCall
from radixserve.api.openai.bodies import ChatCompletionResponse
from radixserve.api.openai.chat import ChatCall
from radixserve.server.result import RequestResult
from radixserve.types import FinishKind, FinishReason

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(err: APIError) -> dict[str, Any]:
    """An error in Anthropic's shape."""
    kind = ERROR_TYPES.get(err.status_code, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def error_event(err: APIError) -> str:
    return event("error", {"error": error_body(err)["error"]})


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def stop_reason(reason: FinishReason | None, has_calls: bool) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished choice."""
    if has_calls:
        return "tool_use", None
    if reason is not None and reason.kind == FinishKind.LENGTH:
        return "max_tokens", None
    if reason is not None and reason.kind == FinishKind.STOP_STR:
        return "stop_sequence", str(reason.matched)
    return "end_turn", None


def usage(result: RequestResult) -> dict[str, int]:
    cached = result.cached_tokens
    return {
        "input_tokens": result.prompt_tokens - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": result.completion_tokens,
    }


def tool_use(call: ParsedCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        arguments = {"arguments": call.arguments}
    return {
        "type": "tool_use",
        "id": f"toolu_{uuid.uuid4().hex[:24]}",
        "name": call.name,
        "input": arguments if isinstance(arguments, dict) else {"value": arguments},
    }


def compaction(text: str) -> dict[str, Any]:
    """The ``compaction`` block holding a summary (``api/summary.py``)."""
    return {"type": "compaction", "content": text, "encrypted_content": None, "signature": None}


@dataclass
class Reply:
    """What each form of an answer carries beside its content: the served model's name, the
    message's id, the blocks before the answer (a compaction made first), the context edits
    applied (``context_management``; None where none were asked for), and what is told the
    finished content (a thread holds it)."""

    model: str = ""
    id: str = field(default_factory=message_id)
    lead: list[dict[str, Any]] = field(default_factory=list)
    managed: dict[str, Any] | None = None
    done: Callable[[list[dict[str, Any]]], None] | None = None

    def head(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def extra(self) -> dict[str, Any]:
        return {} if self.managed is None else {"context_management": self.managed}

    def finish(self, content: list[dict[str, Any]]) -> None:
        if self.done is not None:
            self.done(content)


def compacted(text: str, result: RequestResult, reply: Reply) -> dict[str, Any]:
    """A message of the compaction alone (``compaction``, or a compaction edit that pauses
    after it): ``stop_reason`` ``compaction``, the summary's usage."""
    content = [compaction(text)]
    reply.finish(content)
    return {
        **reply.head(),
        "content": content,
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": usage(result),
        **reply.extra(),
    }


def message(chat: ChatCompletionResponse, result: RequestResult, reply: Reply) -> dict[str, Any]:
    """The whole answer: the chat response's one choice as content blocks, after the reply's
    lead."""
    choice = chat.choices[0]
    content: list[dict[str, Any]] = list(reply.lead)
    if choice.message.reasoning_content:
        thinking = choice.message.reasoning_content
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if choice.message.content:
        content.append({"type": "text", "text": choice.message.content})
    for call in choice.message.tool_calls or []:
        parsed = ParsedCall(call["function"]["name"], call["function"]["arguments"])
        content.append(tool_use(parsed))
    reason, sequence = stop_reason(result.finish_reason, bool(choice.message.tool_calls))
    reply.finish(content)
    return {
        **reply.head(),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(result),
        **reply.extra(),
    }


async def compacted_stream(text: str, result: RequestResult, reply: Reply) -> AsyncIterator[str]:
    """:func:`compacted`, streamed."""
    blocks = _Blocks()
    yield event("message_start", {"message": _start(reply, result)})
    yield from_list(_compaction_events(blocks, text) + blocks.close())
    reply.finish([compaction(text)])  # held before the client can read the end
    delta = {"delta": {"stop_reason": "compaction", "stop_sequence": None}}
    yield event("message_delta", {**delta, "usage": usage(result), **reply.extra()})
    yield event("message_stop", {})


def _start(reply: Reply, result: RequestResult) -> dict[str, Any]:
    """``message_start``'s message: nothing written yet."""
    counted = {"input_tokens": result.prompt_tokens, "output_tokens": 0}
    return {
        **reply.head(),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": counted,
    }


def _compaction_events(blocks: _Blocks, text: str) -> list[str]:
    opened = blocks.open({**compaction(text), "content": None})
    return opened + blocks.delta("compaction", {"type": "compaction_delta", "content": text})


async def stream(call: ChatCall, split: ReasoningStream, reply: Reply) -> AsyncIterator[str]:
    """The events of one streamed message (see the module doc), after the reply's lead's;
    ``message_delta`` carries the context edits applied. Told the whole content at the end."""
    result = RequestResult(call.requests[0])
    blocks = _Blocks()
    tools = call.plan.stream()
    said: dict[str, list[str]] = {"thinking": [], "text": []}
    yield event("message_start", {"message": _start(reply, result)})
    for block in reply.lead:
        yield from_list(_compaction_events(blocks, block["content"]))
    async for _, out in call.group.events():
        result.add(out)
        final = out.output.finish_reason is not None
        thinking, answer = split.feed(out.text, final)
        if thinking:
            said["thinking"].append(thinking)
            yield from_list(
                blocks.delta("thinking", {"type": "thinking_delta", "thinking": thinking})
            )
        text = tools.feed(answer)
        if text:
            said["text"].append(text)
            yield from_list(blocks.delta("text", {"type": "text_delta", "text": text}))
    text, calls = tools.finish()
    if text:
        said["text"].append(text)
        yield from_list(blocks.delta("text", {"type": "text_delta", "text": text}))
    uses = [tool_use(parsed) for parsed in calls]
    for block in uses:
        partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield from_list(blocks.open({**block, "input": {}}) + blocks.delta("tool_use", partial))
    yield from_list(blocks.close())
    reason, sequence = stop_reason(result.finish_reason, bool(calls))
    reply.finish([*reply.lead, *_said(said), *uses])  # held before the client can read the end
    delta = {"delta": {"stop_reason": reason, "stop_sequence": sequence}}
    yield event("message_delta", {**delta, "usage": usage(result), **reply.extra()})
    yield event("message_stop", {})


def _said(said: dict[str, list[str]]) -> list[dict[str, Any]]:
    """A stream's thinking and text as the blocks a whole message holds."""
    out: list[dict[str, Any]] = []
    if thinking := "".join(said["thinking"]):
        out.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if text := "".join(said["text"]):
        out.append({"type": "text", "text": text})
    return out


def from_list(events: list[str]) -> str:
    return "".join(events)


class _Blocks:
    """The content blocks of a stream: one open at a time, numbered as they open."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def open(self, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.kind = block["type"]
        return out + [event("content_block_start", {"index": self.index, "content_block": block})]

    def delta(self, kind: str, delta: dict[str, Any]) -> list[str]:
        out = []
        if self.kind != kind:
            empty = {"thinking": {"thinking": "", "signature": ""}, "text": {"text": ""}}
            out = self.open({"type": kind, **empty.get(kind, {})})
        return out + [event("content_block_delta", {"index": self.index, "delta": delta})]

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"index": self.index})]
