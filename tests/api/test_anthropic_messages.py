"""Anthropic's Messages API through the official ``anthropic`` client, unchanged, against a real
server (``compat_server``: a template that renders tools): one pipeline with the chat route
(the same prompt and text), tools forced and streamed, a tool result's turn hitting the cache,
``count_tokens``, structured output through ``messages.parse`` and the fields agents send, the
beta client as coding agents call it, a system message inside the conversation, errors in
Anthropic's shape, ``x-api-key`` on a keyed server."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import openai
import pytest
from keyed_harness import A, KeyedServer
from serving_harness import Server, prompt_tokens
from test_server_tools import MODEL, WEATHER

pytestmark = pytest.mark.timeout(180)
TOOLS: list[Any] = [{"name": "get_weather", "description": "the weather", "input_schema": WEATHER}]
FORCED: Any = {"type": "tool", "name": "get_weather"}


def _system() -> str:
    return f"You are agent {uuid.uuid4().hex}."  # a prompt of its own: no other test's cache


def test_one_pipeline_with_the_chat_route(claude: anthropic.Anthropic, oai: openai.OpenAI) -> None:
    system, question = _system(), "Say something."
    messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    # first a chat request of the same prompt, so both compared below reuse its cached prefix:
    # a cold prefill and a prefix hit round differently in bf16, and a random model's greedy
    # pick can flip at a near tie between the two
    oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    msg = claude.messages.create(
        model=MODEL,
        system=system,
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
        extra_body={"temperature": 0},  # this client's create() no longer takes it
    )
    chat = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "text" and msg.content[0].text == chat.choices[0].message.content
    used = prompt_tokens(msg)
    assert used == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    # the random model may end on its EOS within the 8 tokens: the two routes must agree on it
    reason = {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert msg.stop_reason == reason and (reason == "end_turn" or msg.usage.output_tokens == 8)
    counted = claude.messages.count_tokens(
        model=MODEL, system=system, messages=[{"role": "user", "content": question}]
    )
    assert counted.input_tokens == used


def test_a_forced_tool_call_and_its_result(claude: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris for 2 days?"}]
    # one call: a random model let to add calls may go on adding them up to max_tokens
    once = {**FORCED, "disable_parallel_tool_use": True}
    kwargs: Any = dict(model=MODEL, system=_system(), tools=TOOLS, tool_choice=once)
    # greedy: a random model sampling at temperature 1 may add JSON whitespace up to max_tokens
    greedy: Any = {"extra_body": {"temperature": 0}}
    msg = claude.messages.create(**kwargs, **greedy, messages=messages, max_tokens=128)
    assert msg.stop_reason == "tool_use"
    call = next(b for b in msg.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER)
    # the agent's next turn: the call and its result; the first turn's prompt is a cache hit
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in msg.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
        },
    ]
    again = claude.messages.create(**{**kwargs, "tool_choice": {"type": "auto"}},
                                   messages=messages, max_tokens=4)  # fmt: skip
    assert (again.usage.cache_read_input_tokens or 0) >= msg.usage.input_tokens - 3


def test_a_streamed_tool_call(claude: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "user", "content": "Weather in Oslo for 1 day?"}]
    # sampled at temperature 1: one call at most, so the output's length has a bound (parallel
    # calls let a random model go on adding them up to max_tokens)
    with claude.messages.stream(
        model=MODEL,
        system=_system(),
        tools=TOOLS,
        tool_choice={**FORCED, "disable_parallel_tool_use": True},
        messages=messages,
        max_tokens=128,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    calls = [b for b in final.content if b.type == "tool_use"]
    assert len(calls) == 1, final
    jsonschema.validate(calls[0].input, WEATHER)
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0


def test_structured_output_and_the_fields_agents_send(claude: anthropic.Anthropic) -> None:
    """``messages.parse(output_format=...)`` sends ``output_config.format``: the JSON-schema
    grammar makes the answer, which the client parses into the model; a strict tool with
    examples, top-level ``cache_control`` and ``effort`` are taken, by ``count_tokens`` too."""
    from pydantic import BaseModel

    class Forecast(BaseModel):
        city: Literal["Paris", "Oslo"]
        days: Literal[1, 2, 3]  # bounded: a random model writes digits up to max_tokens
        sunny: bool

    question: Any = [{"role": "user", "content": "Forecast for Oslo as JSON."}]
    kwargs: Any = dict(model=MODEL, system=_system(), messages=question)
    parsed = claude.messages.parse(**kwargs, max_tokens=64, output_format=Forecast)
    assert isinstance(parsed.parsed_output, Forecast), parsed
    assert parsed.stop_reason == "end_turn"
    tool: Any = {**TOOLS[0], "strict": True, "input_examples": [{"city": "Paris", "days": 1}]}
    extra: Any = dict(
        tools=[tool], cache_control={"type": "ephemeral"}, output_config={"effort": "low"}
    )
    one: Any = {**FORCED, "disable_parallel_tool_use": True}  # greedy, one call: a bound
    msg = claude.messages.create(
        **kwargs, **extra, tool_choice=one, max_tokens=128, extra_body={"temperature": 0}
    )
    assert msg.stop_reason == "tool_use", msg
    counted = claude.messages.count_tokens(**kwargs, **extra)
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    schema = {"type": "json_schema", "schema": Forecast.model_json_schema()}
    with_format = claude.messages.count_tokens(**kwargs, output_config={"format": schema})
    assert with_format.input_tokens > 0
    xml: Any = {"format": {"type": "xml"}}
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(**kwargs, max_tokens=4, output_config=xml)


def test_the_beta_client_as_coding_agents_call_it(claude: anthropic.Anthropic) -> None:
    """``client.beta.messages`` (what coding agents call): the betas as a header, context
    editing and service hints taken, streamed and counted; server-side MCP servers and
    containers refused by name (threads: ``test_anthropic_threads.py``)."""
    system: Any = [{"type": "text", "text": _system(), "cache_control": {"type": "ephemeral"}}]
    kwargs: Any = dict(
        model=MODEL,
        system=system,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,
        betas=["context-management-2025-06-27"],
        context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
    )
    # greedy, one call: a bound on the output's length (as in the tests above)
    one: Any = {**FORCED, "disable_parallel_tool_use": True}
    hints: Any = {"fallbacks": [{"model": "other"}], "extra_body": {"temperature": 0}}
    with claude.beta.messages.stream(**kwargs, tool_choice=one, max_tokens=128, **hints) as stream:
        msg = stream.get_final_message()
    assert msg.stop_reason == "tool_use", msg
    counted = claude.beta.messages.count_tokens(**kwargs)
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    refused: Any = [
        ("mcp_servers", [{"type": "url", "url": "https://mcp.example", "name": "x"}]),
        ("container", "container_1"),
    ]
    for name, value in refused:
        with pytest.raises(anthropic.BadRequestError, match=f"{name} is not supported"):
            claude.beta.messages.create(**kwargs, max_tokens=4, extra_body={name: value})


def test_a_system_message_inside_the_conversation(
    claude: anthropic.Anthropic, oai: openai.OpenAI
) -> None:
    """Claude Code sends context as a message of role ``system`` after the user's first: it
    renders where it stands, as the chat route renders the same messages."""
    system, note = _system(), "Available agent types: none."
    messages: Any = [{"role": "user", "content": "Say hi."}, {"role": "system", "content": note}]
    counted = claude.messages.count_tokens(model=MODEL, system=system, messages=messages)
    chat: Any = [{"role": "system", "content": system}, *messages]
    answer = oai.chat.completions.create(model=MODEL, messages=chat, max_tokens=1)
    assert counted.input_tokens == answer.usage.prompt_tokens
    msg = claude.messages.create(model=MODEL, system=system, messages=messages, max_tokens=2)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == counted.input_tokens


def test_errors_take_anthropics_shape(claude: anthropic.Anthropic, compat_server: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MODEL, messages=[], max_tokens=4)
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    raw = httpx.post(f"{compat_server.url}/v1/messages", json={"model": MODEL}, timeout=30)
    assert raw.status_code == 400 and raw.json()["type"] == "error"


def test_x_api_key_names_the_tenant(keyed_server: KeyedServer) -> None:
    client = anthropic.Anthropic(base_url=keyed_server.url, api_key=A, max_retries=0)
    model = client.models.list().data[0].id if hasattr(client, "models") else None
    assert model
    msg = client.messages.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert msg.usage.output_tokens == 2
    wrong = anthropic.Anthropic(base_url=keyed_server.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
