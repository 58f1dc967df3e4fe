"""OpenAI's Responses API body (``POST /v1/responses``) and its conversion into the chat route's
request: the one pipeline renders, runs and parses.

- ``input``: a string (one user message) or items: messages (``role`` and ``content``, a
  string or ``input_text`` / ``output_text`` parts), ``function_call`` (an earlier call of the
  model's), ``function_call_output`` (its result: a ``tool`` message of that call id), the
  same of a custom tool (``custom_tool_call``, ``custom_tool_call_output``), ``compaction``
  (the summary it holds, as a user message: ``compaction.py``) and ``reasoning`` (the next
  assistant turn's ``reasoning_content``: :func:`items_messages`);
- ``instructions``: the system message (not carried to a chained response, as OpenAI does);
- ``previous_response_id``: the stored conversation before ``input`` (``store.py``), or
  ``conversation``: a conversation's items (``conversations.py``), not both;
- function and custom ``tools`` (``custom_tools.py``; also grouped in a ``namespace``; hosted
  tools are not offered: this server runs none) and ``tool_choice``; ``text.format``
  (``json_schema``, ``json_object``, ``text``) as chat's ``response_format``;
  ``reasoning.effort`` as chat's ``reasoning_effort``; ``max_output_tokens``, ``temperature``,
  ``top_p``; ``truncation`` (``auto``: the middle of a conversation too long for the context
  goes, ``truncation.py``);
- ``include: ["message.output_text.logprobs"]`` (or ``top_logprobs`` set) and ``top_logprobs``:
  the message's text carries its tokens' logprobs, as chat's ``logprobs`` (the other
  ``include`` values name what hosted tools and encrypted reasoning would add: nothing here).

Fields OpenAI's service alone can honour (background runs, stored prompts, its context
management) are a 400 naming them; hints without effect here are accepted.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from radixserve.api.formats import custom_tools
from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.responses import compaction

# tools OpenAI's service runs itself: not offered to the model (this server runs none), so a
# client that lists one among its function tools (Codex lists web search) is served the rest
HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "mcp",
    "tool_search",
)
LOGPROBS = "message.output_text.logprobs"  # the ``include`` value that asks for them
REFUSED = (
    "background",
    "background_options",
    "prompt",
    "image",
    "max_tool_calls",
)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None  # an id, or {"id": ...}
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    parallel_tool_calls: bool = True
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None  # truncation.py
    # SGLang's extensions, as on the chat route: the whole output constrained by a regex, and
    # the sampling fields SGLang's gateway (smg) sends with every request it forwards
    regex: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    priority: int | None = None
    include: list[str] | None = None  # LOGPROBS alone has an effect here
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # accepted without effect here
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    moderation: Any = None
    access_programs: Any = None
    client_metadata: dict[str, Any] | None = None  # Codex's
    # refused when set (REFUSED)
    background: bool | None = None
    background_options: Any = None
    prompt: Any = None
    image: Any = None
    max_tool_calls: int | None = None
    # compaction inside a create (``compaction.py``): [{"type": "compaction",
    # "compact_threshold": tokens}]
    context_management: list[dict[str, Any]] | None = None

    @field_validator("stream", "store", "parallel_tool_calls", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        """An explicit null (OpenAI's spec allows it; SGLang's gateways forward one) is the
        default."""
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @model_validator(mode="after")
    def _refuse(self) -> ResponsesRequest:
        for name in REFUSED:
            if getattr(self, name) not in (None, False):
                raise ValueError(f"{name} is not supported by this server")
        if self.previous_response_id is not None and self.conversation is not None:
            raise ValueError("give previous_response_id or conversation, not both")
        if isinstance(self.conversation, dict) and not isinstance(self.conversation.get("id"), str):
            raise ValueError("conversation must be an id or an object with its id")
        for entry in self.context_management or []:
            if entry.get("type") != "compaction":
                raise ValueError("context_management entries of type compaction are served")
            threshold = entry.get("compact_threshold")
            if threshold is not None and (not isinstance(threshold, int) or threshold < 1):
                raise ValueError("compact_threshold must be a positive number of tokens")
        for tool in self.tools or []:
            kind = tool.get("type")
            inner = tool.get("tools", []) if kind == "namespace" else []
            if kind not in ("function", "custom", "namespace", *HOSTED_TOOLS) or any(
                t.get("type") not in ("function", "custom") for t in inner
            ):
                raise ValueError(
                    f"tools of type {kind!r} are not served (function and custom tools are)"
                )
            for each in [tool, *inner]:
                if each.get("type") == "custom":
                    custom_tools.check(each)
        return self

    def function_tools(self) -> list[dict[str, Any]]:
        """The tools the model is offered, as functions: each function tool, each custom tool
        (``custom_tools.py``), those of each ``namespace`` (a named group, as Codex sends),
        not the hosted ones (:data:`HOSTED_TOOLS`)."""
        out: list[dict[str, Any]] = []
        for tool in self.tools or []:
            if tool.get("type") in ("function", "custom"):
                out.append(_as_function(tool))
            elif tool.get("type") == "namespace":
                out += [{**_as_function(t), "namespace": tool["name"]} for t in tool["tools"]]
        return out

    def compact_threshold(self, context_len: int) -> int | None:
        """The prompt's tokens past which it is compacted first (None: ``context_management``
        asks for no compaction): the entry's threshold, else
        :data:`compaction.DEFAULT_THRESHOLD` of the context."""
        if not self.context_management:
            return None
        given = [e.get("compact_threshold") for e in self.context_management]
        found = [t for t in given if t is not None]
        return min(found) if found else int(context_len * compaction.DEFAULT_THRESHOLD)

    def custom_names(self) -> frozenset[str]:
        """The names of the custom tools: their calls are ``custom_tool_call`` items."""
        return frozenset(t["name"] for t in self.function_tools() if t.get("custom"))

    def namespaces(self) -> dict[str, str]:
        """A namespace's function's name -> the namespace (its calls name it, as OpenAI's)."""
        return {t["name"]: t["namespace"] for t in self.function_tools() if "namespace" in t}

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, dict):
            return str(self.conversation["id"])
        return self.conversation

    def logprobs(self) -> int | None:
        """How many top logprobs each output token carries (None: no logprobs): asked for by
        ``include`` or by ``top_logprobs`` set above 0."""
        if LOGPROBS in (self.include or []) or self.top_logprobs:
            return self.top_logprobs or 0
        return None

    def input_messages(self) -> list[dict[str, Any]]:
        """``input`` as the chat route's messages."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return items_messages(self.input)

    def to_chat(self, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The request in the chat route's words: ``messages`` (the stored conversation and
        the input, as chat messages: ``truncation.py``) after the instructions."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        body: dict[str, Any] = {"messages": system + messages}
        if self.model is not None:
            body["model"] = self.model
        effort = (self.reasoning or {}).get("effort")
        for name, value in (
            ("reasoning_effort", effort),
            ("max_tokens", self.max_output_tokens),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("regex", self.regex),
            ("top_k", self.top_k),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("priority", self.priority),
            ("top_logprobs", self.logprobs()),
        ):
            if value is not None:
                body[name] = value
        body["logprobs"] = self.logprobs() is not None
        tools = self.function_tools()
        if tools:
            body["tools"] = [_chat_tool(tool) for tool in tools]
            if self.tool_choice is not None:
                body["tool_choice"] = _tool_choice(self.tool_choice)
            body["parallel_tool_calls"] = self.parallel_tool_calls
        fmt = (self.text or {}).get("format")
        if fmt and fmt.get("type") != "text":
            body["response_format"] = _response_format(fmt)
        request = ChatCompletionRequest.model_validate(body)
        for tool, given in zip(request.tools or [], tools, strict=True):  # kept in auto mode
            tool.custom = bool(given.get("custom"))
        return request


def items_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as the chat route's messages. The calls that follow an assistant's text or call
    join its message: one turn, as the model wrote it and the template renders it again (an
    agent that re-sends a turn's text and parallel calls as separate items would otherwise
    render them as turns of their own, and miss the cache from the second on). A ``reasoning``
    item is the ``reasoning_content`` of the assistant turn that follows it, which the template
    renders or drops as it was trained to (Qwen3's keeps the thinking of the turns since the
    last user message: an agent's tool loop then renders what the model wrote, a radix hit).
    Before a ``compaction`` item only the user messages count: the item holds the rest."""
    items = compaction.window(items)
    out: list[dict[str, Any]] = []
    thinking: str | None = None  # a reasoning item's, for the next assistant turn
    for item in items:
        if item.get("type") == "reasoning":
            thinking = _reasoning_text(item) or None
            continue
        for message in _item_messages(item):
            last = out[-1] if out else None
            if last and last["role"] == "assistant" and message.get("tool_calls"):
                last["tool_calls"] = [*last.get("tool_calls", []), *message["tool_calls"]]
            else:
                if thinking is not None and message["role"] == "assistant":
                    message["reasoning_content"] = thinking
                out.append(message)
        thinking = None
    return out


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its summary."""
    parts = item.get("content") or item.get("summary") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


class CompactRequest(ResponsesRequest):
    """``POST /v1/responses/compact``: the conversation to compact (``input`` after
    ``previous_response_id``'s, with ``instructions``)."""


class InputTokensRequest(ResponsesRequest):
    """``POST /v1/responses/input_tokens``: the body of a response to count the prompt of."""

    personality: str | None = None  # a hint without effect here


def _item_messages(item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item.get("type", "message")
    if kind == "message":
        return [{"role": item["role"], "content": _content_text(item.get("content", ""))}]
    if kind == "function_call":
        call = {"name": item["name"], "arguments": item.get("arguments", "{}")}
        tool_call = {"id": item["call_id"], "type": "function", "function": call}
        return [{"role": "assistant", "content": None, "tool_calls": [tool_call]}]
    if kind == "custom_tool_call":
        call = {"name": item["name"], "arguments": custom_tools.call_arguments(item["input"])}
        tool_call = {"id": item["call_id"], "type": "function", "function": call}
        return [{"role": "assistant", "content": None, "tool_calls": [tool_call]}]
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output", "")
        text = output if isinstance(output, str) else json.dumps(output)
        return [{"role": "tool", "tool_call_id": item["call_id"], "content": text}]
    if kind == "compaction":
        return [compaction.message(item)]
    if kind == "reasoning":
        return []
    raise ValueError(f"input items of type {kind!r} are not supported")


def _content_text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise ValueError(f"content parts of type {part.get('type')!r} are not supported")
        parts.append(part.get("text", ""))
    return "".join(parts)


def _as_function(tool: dict[str, Any]) -> dict[str, Any]:
    return custom_tools.as_function(tool) if tool.get("type") == "custom" else tool


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") in ("function", "custom") and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("type") == "allowed_tools":  # every tool rendered, these callable
        listed = choice.get("tools") or []
        names = [t.get("name") if isinstance(t, dict) else None for t in listed]
        named = [{"type": "function", "function": {"name": name}} for name in names]
        return {
            "type": "allowed_tools",
            "allowed_tools": {"mode": choice.get("mode"), "tools": named},
        }
    raise ValueError(f"tool_choice {choice!r} is not supported")


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    kind: Literal["json_schema", "json_object"] = fmt["type"]
    if kind == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}
