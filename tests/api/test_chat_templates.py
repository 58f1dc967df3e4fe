"""Chat templates as the checkpoint defines them: the prompt ids the chat route renders (the
OpenAI request's messages through ``ChatCompletionRequest`` and the HTTP process's
``PromptTokenizer``) equal transformers' ``apply_chat_template`` on the same conversation
written as Hugging Face messages, for Qwen3's and Llama 3.1's real tokenizers and templates:
system prompts, tools, tool calls and their results, multi-turn assistant turns,
``chat_template_kwargs`` (``enable_thinking``), ``add_generation_prompt`` and
``continue_final_message``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.server.prompt_tokenizer import PromptTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CALL_ARGS = {"city": "Paris", "unit": "c"}


def _conversation() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(OpenAI messages, the same as Hugging Face messages) with a call and its result."""
    openai_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(CALL_ARGS)},
    }
    hf_call = {**openai_call, "function": {"name": "get_weather", "arguments": CALL_ARGS}}
    head = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris? Ünïcödé, 日本語."},
    ]
    tail = [
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 degrees."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    openai = [*head, {"role": "assistant", "content": "", "tool_calls": [openai_call]}, *tail]
    hf = [*head, {"role": "assistant", "content": "", "tool_calls": [hf_call]}, *tail]
    return openai, hf


SIMPLE = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Count to 3"},
]
CASES = {
    "multi-turn": dict(messages=SIMPLE),
    "no-system": dict(messages=SIMPLE[1:]),
    "tools": dict(messages=SIMPLE[1:2], tools=[WEATHER]),
    "tool-result": dict(conversation=True, tools=[WEATHER]),
    "no-generation-prompt": dict(messages=SIMPLE, add_generation_prompt=False),
    "continue-final": dict(
        messages=[*SIMPLE, {"role": "assistant", "content": "1, 2"}],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
}
THINKING = {
    "thinking-off": dict(messages=SIMPLE, chat_template_kwargs={"enable_thinking": False}),
    "thinking-on": dict(messages=SIMPLE, chat_template_kwargs={"enable_thinking": True}),
}


def _ids(out: Any) -> list[int]:
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _check(tokenizer: Any, case: dict[str, Any]) -> None:
    tools = case.get("tools")
    if case.get("conversation"):
        openai_messages, hf_messages = _conversation()
    else:
        openai_messages = hf_messages = case["messages"]
    options = {
        k: case[k]
        for k in ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")
        if k in case
    }
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": openai_messages, "tools": tools, **options}
    )
    prompts = PromptTokenizer(tokenizer)
    got = asyncio.run(
        prompts.apply_chat_template(
            [m.to_template_dict() for m in body.messages],
            tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            **(body.chat_template_kwargs or {}),
        )
    )
    expected = tokenizer.apply_chat_template(
        hf_messages,
        tools=tools,
        tokenize=True,
        add_generation_prompt=case.get("add_generation_prompt", True),
        continue_final_message=case.get("continue_final_message", False),
        **case.get("chat_template_kwargs", {}),
    )
    assert got == _ids(expected)
    assert got[-1] not in tokenizer.all_special_ids or case.get("add_generation_prompt") is False


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_route_renders_what_transformers_renders(
    checkpoint_tokenizers: dict[str, Any], family: str, name: str
) -> None:
    _check(checkpoint_tokenizers[family], CASES[name])


@pytest.mark.parametrize("name", sorted(THINKING))
def test_qwen3_enable_thinking(checkpoint_tokenizers: dict[str, Any], name: str) -> None:
    tokenizer = checkpoint_tokenizers["qwen3"]
    _check(tokenizer, THINKING[name])
    text = tokenizer.decode(
        asyncio.run(
            PromptTokenizer(tokenizer).apply_chat_template(
                SIMPLE, **THINKING[name]["chat_template_kwargs"]
            )
        )
    )
    closed = text.endswith("<think>\n\n</think>\n\n")  # thinking off: an empty block, closed
    assert closed == (name == "thinking-off")


def test_continue_final_message_needs_an_assistant_turn_and_no_generation_prompt() -> None:
    with pytest.raises(ValueError, match="add_generation_prompt"):
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": SIMPLE, "continue_final_message": True}
        )
    with pytest.raises(ValueError, match="assistant message last"):
        ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "messages": SIMPLE,
                "continue_final_message": True,
                "add_generation_prompt": False,
            }
        )
