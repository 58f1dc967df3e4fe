"""The chat pipeline's result in the Responses API's words: the ``response`` object (its
``output`` items: ``reasoning`` with ``--reasoning-parser``, the assistant ``message``, each
``function_call``) and, streamed, OpenAI's events in the order its client reads them:
``response.created``, ``response.in_progress``, then per item ``response.output_item.added``,
(a message's ``response.content_part.added``, ``response.output_text.delta`` ...,
``response.output_text.done``, ``response.content_part.done``; a call's
``response.function_call_arguments.delta`` / ``.done``), ``response.output_item.done``, and
``response.completed``, or ``response.incomplete`` when the length limit cut it (OpenAI's
event: the Agents SDK raises on it, streamed, as it does on an ``incomplete`` status when not
streamed, and the official client's ``get_final_response`` has no response to give)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from radixserve.api.formats import custom_tools
from radixserve.api.formats.reasoning import ReasoningStream
from radixserve.api.formats.tool_calls import ParsedCall
from radixserve.api.openai.chat import ChatCall
from radixserve.api.responses.protocol import ResponsesRequest
from radixserve.server.result import RequestResult
from radixserve.types import FinishKind

Logprobs = Sequence[dict[str, Any]]  # OpenAI's per token: token, logprob, bytes, top_logprobs


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(
    text: str, item_id: str, status: str = "completed", logprobs: Logprobs = ()
) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def call_item(call: ParsedCall, body: ResponsesRequest) -> dict[str, Any]:
    """A call's item: a ``function_call``, or a custom tool's ``custom_tool_call`` (its
    ``input`` read from the arguments: ``custom_tools.py``); a call of one of a namespace's
    tools names its namespace, as OpenAI's do."""
    item: dict[str, Any]
    if call.name in body.custom_names():
        item = {"type": "custom_tool_call", "id": new_id("ctc"), "call_id": new_id("call")}
        item |= {"name": call.name, "input": custom_tools.call_input(call.arguments)}
    else:
        item = {"type": "function_call", "id": new_id("fc"), "call_id": new_id("call")}
        item |= {"name": call.name, "arguments": call.arguments}
    item["status"] = "completed"
    namespaces = body.namespaces()
    if call.name in namespaces:
        item["namespace"] = namespaces[call.name]
    return item


def reasoning_item(text: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": content}


def response_body(
    body: ResponsesRequest,
    response_id: str,
    model: str,
    output: list[dict[str, Any]],
    result: RequestResult | None,
) -> dict[str, Any]:
    """The response object (``result`` None: still in progress)."""
    cut = was_cut(result)
    status = "in_progress" if result is None else ("incomplete" if cut else "completed")
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "instructions": body.instructions,
        "previous_response_id": body.previous_response_id,
        "conversation": {"id": body.conversation_id} if body.conversation_id else None,
        "tools": body.tools or [],
        "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_logprobs": body.top_logprobs,
        "max_output_tokens": body.max_output_tokens,
        "text": body.text or {"format": {"type": "text"}},
        "store": body.store,
        "metadata": body.metadata or {},
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "usage": None if result is None else usage(result),
    }


def was_cut(result: RequestResult | None) -> bool:
    """Whether the length limit cut ``result``: the response and its message are then
    ``incomplete``, as OpenAI's."""
    finish = None if result is None else result.finish_reason
    return finish is not None and finish.kind == FinishKind.LENGTH


def usage(result: RequestResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def output_items(
    reasoning: str | None,
    content: str | None,
    calls: list[ParsedCall],
    body: ResponsesRequest,
    logprobs: Logprobs = (),
    cut: bool = False,
) -> list[dict[str, Any]]:
    """The output items; the message's text carries ``logprobs`` (the output's tokens, as
    chat's ``logprobs.content`` has them: a thinking or a call's tokens too); ``cut``: the
    length limit cut it (the message is ``incomplete``)."""
    out = [reasoning_item(reasoning)] if reasoning else []
    if content:
        status = "incomplete" if cut else "completed"
        out.append(message_item(content, new_id("msg"), status, logprobs))
    return out + [call_item(call, body) for call in calls]


class _Stream:
    """One streamed response: its events numbered in order, its output items as they close."""

    def __init__(self) -> None:
        self.number = -1
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the open message item
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []  # the output's tokens' so far
        self.sent = 0  # how many of them a text delta has carried

    def emit(self, kind: str, **data: Any) -> str:
        self.number += 1
        payload = {"type": kind, "sequence_number": self.number, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def item(self, item: dict[str, Any], arguments: bool = False) -> list[str]:
        """A whole item: added (in progress), a call's arguments (``arguments``), done."""
        index = len(self.output)
        self.output.append(item)
        opening = {**item, "status": "in_progress"}
        out = [self.emit("response.output_item.added", output_index=index, item=opening)]
        if arguments:  # a call's, in one delta
            at = {"item_id": item["id"], "output_index": index}
            kind, field = "function_call_arguments", "arguments"
            if item["type"] == "custom_tool_call":
                kind, field = "custom_tool_call_input", "input"
            text = item[field]
            out.append(self.emit(f"response.{kind}.delta", **at, delta=text))
            out.append(self.emit(f"response.{kind}.done", **at, **{field: text}))
        return out + [self.emit("response.output_item.done", output_index=index, item=item)]

    def text_delta(self, delta: str) -> list[str]:
        out = []
        if self.message is None:
            self.message = message_item("", new_id("msg"), "in_progress")
            index = len(self.output)
            self.output.append(self.message)
            added = {**self.message, "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.emit("response.output_item.added", output_index=index, item=added))
            out.append(self.emit("response.content_part.added", **self._at(), part=part))
        self.text += delta
        fresh, self.sent = self.logprobs[self.sent :], len(self.logprobs)
        return out + [
            self.emit("response.output_text.delta", **self._at(), delta=delta, logprobs=fresh)
        ]

    def close_message(self, cut: bool) -> list[str]:
        if self.message is None:
            return []
        status = "incomplete" if cut else "completed"
        done = message_item(self.text, self.message["id"], status, self.logprobs)
        at = self._at()
        self.output[at["output_index"]] = done
        return [
            self.emit("response.output_text.done", **at, text=self.text, logprobs=self.logprobs),
            self.emit("response.content_part.done", **at, part=done["content"][0]),
            self.emit("response.output_item.done", output_index=at["output_index"], item=done),
        ]

    def _at(self) -> dict[str, Any]:
        assert self.message is not None
        index = self.output.index(self.message)
        return {"item_id": self.message["id"], "output_index": index, "content_index": 0}


async def stream(
    call: ChatCall,
    body: ResponsesRequest,
    split: ReasoningStream,
    model: str,
    response_id: str,
    done: list[dict[str, Any]],
    logprobs: Callable[[RequestResult, int], Logprobs],
    lead: list[dict[str, Any]],
) -> AsyncIterator[str]:
    """The events of one streamed response; the finished response object is appended to
    ``done`` (for the store). ``logprobs(result, start)``: the result's tokens' from output
    position ``start`` on (empty when the body asks for none); ``lead``: whole items the
    output starts with (a compaction made before the generation)."""
    out, result, tools = _Stream(), RequestResult(call.requests[0]), call.plan.stream()
    started = response_body(body, response_id, model, [], None)
    yield out.emit("response.created", response=started)
    yield out.emit("response.in_progress", response=started)
    for item in lead:
        for event in out.item(item):
            yield event
    thought = False
    async for _, output in call.group.events():
        start = len(result.output_ids)
        result.add(output)
        out.logprobs += logprobs(result, start)
        _, answer = split.feed(output.text, output.output.finish_reason is not None)
        if not thought and split.had_thinking and (answer or output.output.finish_reason):
            thought = True  # the thinking is whole: its item comes first
            for event in out.item(reasoning_item(split.reasoning)):
                yield event
        for event in out.text_delta(delta) if (delta := tools.feed(answer)) else []:
            yield event
    rest, calls = tools.finish()
    # the last tokens may add no text (an end of turn's): a last delta carries their logprobs
    unsent = out.message is not None and out.sent < len(out.logprobs)
    events = (out.text_delta(rest) if rest or unsent else []) + out.close_message(was_cut(result))
    for parsed in calls:
        events += out.item(call_item(parsed, body), arguments=True)
    for event in events:
        yield event
    final = response_body(body, response_id, model, out.output, result)
    done.append(final)
    yield out.emit(f"response.{final['status']}", response=final)
