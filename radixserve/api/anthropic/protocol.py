"""Anthropic's Messages API bodies (``POST /v1/messages``, ``/v1/messages/count_tokens``), and
their conversion into the chat route's request: the one pipeline renders, runs and parses.

- ``system`` (a string or text blocks) is the chat's system message; a message of role
  ``system`` inside ``messages`` (Claude Code sends one) a system message where it stands;
- a message's content is a string or blocks: ``text``; ``tool_use`` (an assistant's call,
  its ``input`` the arguments); ``tool_result`` (a user's answer to a call: a ``tool`` message
  of that call's id); ``thinking`` (an assistant's earlier thinking: its turn's
  ``reasoning_content``, which the template renders or drops as it was trained to, as Claude
  keeps a tool loop's thinking) and ``redacted_thinking`` (dropped); ``image`` and ``document``
  blocks are refused (a text model);
- ``tools`` (``name``, ``description``, ``input_schema``) are chat's function tools;
  ``tool_choice`` ``auto``, ``any`` (chat's ``required``), ``tool`` (a named function) and
  ``none``;
- ``stop_sequences``, ``max_tokens`` and (sent as extra fields by clients that no longer
  offer them) ``temperature``, ``top_p``, ``top_k`` are the sampling fields;
- ``output_config.format`` (structured outputs: a JSON schema) is chat's ``response_format``,
  and a tool's ``strict`` its function's;
- ``thinking`` is the template's ``enable_thinking`` (false when ``disabled``: Qwen3's and
  other hybrid templates');
- ``context_management``'s edits (``api/anthropic/edits.py``): clearing old tool results and
  thinking (``api/anthropic/clearing.py``), and ``compact_20260112`` (past its trigger,
  compact first); with ``compaction`` (summarize the conversation and return only that) this
  is ``api/summary.py``'s compaction, and a ``compaction`` block sent back stands in for the
  messages before it;
- ``thread`` (``api/anthropic/threads.py``): the conversation held by the server, so a turn
  sends only its new messages;
- ``output_config.effort`` and Anthropic's service hints are accepted without effect;
  ``container`` and ``mcp_servers`` are refused. Unknown fields are a 400 naming them, as on
  every route.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixserve.api import summary
from radixserve.api.anthropic.edits import Compact, ContextManagement
from radixserve.api.openai.protocol import ChatCompletionRequest, thinking_kwargs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Echoed(BaseModel):
    """A block a client sends back as its own client read it from a response: the fields a
    newer client adds to it (``caller``, ``toolset_name``, ...) are taken and ignored."""

    model_config = ConfigDict(extra="ignore")


class TextBlock(_Echoed):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolUseBlock(_Echoed):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(_Echoed):
    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class CompactionBlock(_Echoed):
    """A compaction sent back (first in ``messages``, in place of what it summarizes): its
    ``content`` renders as a user message giving the summary; null content (a compaction that
    failed) is no block at all."""

    type: Literal["compaction"]
    content: str | None = None
    encrypted_content: str | None = None
    signature: str | None = None


class CompactionConfig(_Strict):
    """``compaction``: summarize the whole conversation, and return that alone."""

    type: Literal["summarize"]
    instructions: str | None = None


Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | CompactionBlock


class Message(_Strict):
    # "system": a system message inside the conversation, where Claude Code sends context
    # (rendered where it stands, as the chat route renders one)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class AnthropicTool(_Strict):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: Literal["custom"] | None = None
    strict: bool | None = None  # the chat route's function ``strict``
    # accepted without effect: caching, examples, tool search, programmatic calls, streaming
    cache_control: dict[str, Any] | None = None
    input_examples: list[dict[str, Any]] | None = None
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None
    eager_input_streaming: bool | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    """Structured outputs: ``format`` is the chat route's JSON-schema ``response_format``;
    ``effort`` is accepted without effect."""

    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThreadCreate(_Strict):
    type: Literal["create"]


class ThreadContinue(_Strict):
    type: Literal["continue"]
    previous_message_id: str = Field(min_length=1)


Thread = Annotated[ThreadCreate | ThreadContinue, Field(discriminator="type")]


class CountTokensRequest(_Strict):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    # accepted and without effect here: routing, placement and accounting hints of Anthropic's
    # service, and prompt caching (every prompt is cached by prefix already)
    cache_control: dict[str, Any] | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    billing_policy: dict[str, Any] | None = None
    # the beta's context editing (``api/anthropic/edits.py``)
    context_management: ContextManagement | None = None
    compaction: CompactionConfig | None = None  # summarize only (a count ignores it)
    # refused when set (MessagesRequest): server-side MCP tools
    mcp_servers: list[dict[str, Any]] | None = None

    def compact_edit(self) -> Compact | None:
        """The ``compact_20260112`` edit of ``context_management``, if any: compact first when
        the prompt is past its trigger."""
        return self.context_management.compact() if self.context_management else None

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation as the chat route's messages. A compaction block stands in for
        the messages before it (``api/summary.py``'s :func:`told`)."""
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": _text(self.system)})
        lead = len(out)
        for message in self.messages:
            blocks = message.content if isinstance(message.content, list) else []
            for block in blocks:
                if isinstance(block, CompactionBlock) and block.content is not None:
                    out = [*out[:lead], summary.told(block.content)]
            out += _chat_messages(message)
        return out

    def chat_fields(self) -> dict[str, Any]:
        """Tools, the tool choice and the output format as the chat route's."""
        fields: dict[str, Any] = {}
        if self.tools:
            fields["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                        "strict": t.strict,
                    },
                }
                for t in self.tools
            ]
        if self.thinking is not None and "type" in self.thinking:
            fields["chat_template_kwargs"] = thinking_kwargs(self.thinking["type"] != "disabled")
        fmt = self.output_config.format if self.output_config else None
        if fmt is not None:
            schema = {"name": "output", "schema": fmt.schema_, "strict": True}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        if self.tool_choice is not None and self.tools:
            fields["tool_choice"] = _tool_choice(self.tool_choice)
            if self.tool_choice.disable_parallel_tool_use:  # at most one call
                fields["parallel_tool_calls"] = False
        return fields


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = None
    top_k: int | None = None
    # SGLang's extension, as on the chat route: the whole output constrained by a regex
    regex: str | None = None
    # accepted without effect, as above
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    diagnostics: Any = None
    fallbacks: list[Any] | None = None  # this server does not decline: nothing to fall back on
    fallback_credit_token: Any = None
    # held by the server: the conversation so far (``api/anthropic/threads.py``)
    thread: Thread | None = None
    # refused when set: a server-side code container (and, above, MCP servers)
    container: Any = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> MessagesRequest:
        if self.container is not None:
            raise ValueError("container is not supported by this server")
        if self.mcp_servers:
            raise ValueError("mcp_servers is not supported by this server: tools run client-side")
        return self

    def to_chat(self) -> ChatCompletionRequest:
        """The same request in the chat route's words (validated there, as every chat)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.chat_messages(),
            "max_tokens": self.max_tokens,
            **self.chat_fields(),
        }
        for name, value in (
            ("stop", self.stop_sequences),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("top_k", self.top_k),
            ("regex", self.regex),
        ):
            if value is not None:
                body[name] = value
        return ChatCompletionRequest.model_validate(body)


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def _chat_messages(message: Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results become ``tool`` messages (in
    their order), an assistant's calls its ``tool_calls``, its thinking its
    ``reasoning_content``."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock) and block.type == "thinking":
            thinking.append(block.thinking or "")
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock):
            content = _text(block.content)
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
    only_compaction = bool(message.content) and all(
        isinstance(b, CompactionBlock) for b in message.content
    )
    if text or calls or not (out or only_compaction):
        own: dict[str, Any] = {"role": message.role, "content": "".join(text)}
        if calls:
            own["tool_calls"] = calls
        if message.role == "assistant" and "".join(thinking):
            own["reasoning_content"] = "".join(thinking)
        out.append(own)
    return out


def _tool_choice(choice: ToolChoice) -> Any:
    if choice.type == "tool":
        if not choice.name:
            raise ValueError("tool_choice of type tool needs the tool's name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]
