"""Custom tools (``type: "custom"``) through the chat route, with the official ``openai``
client: a forced call comes back as a ``custom`` tool call whose ``input`` matches its regex
format, the same call the Responses API makes for the same conversation (the oracle: one
rendering, ``api/formats/custom_tools.py``); streamed, the same call in one delta; sent back
in the history with its result, it renders as transformers' template renders the function it
was offered as, and the next turn reads the call from the cache."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from test_responses_custom_tools import REGEX, SHELL
from test_server_tools import MODEL

from radixserve.api.formats import custom_tools

pytestmark = pytest.mark.timeout(180)

FORMAT: Any = {"type": "grammar", "grammar": {"syntax": "regex", "definition": REGEX}}
CHAT_SHELL: Any = {
    "type": "custom",
    "custom": {"name": "shell", "description": SHELL["description"], "format": FORMAT},
}
NAMED: Any = {"type": "custom", "custom": {"name": "shell"}}


def _messages() -> list[Any]:
    return [
        {"role": "system", "content": f"You are agent {uuid.uuid4().hex}."},
        {"role": "user", "content": "List the files."},
    ]


def test_a_forced_custom_call_is_the_responses_apis_and_renders_back(
    oai: openai.OpenAI, tools_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    messages = _messages()
    kwargs: Any = dict(model=MODEL, temperature=0, parallel_tool_calls=False)
    chat = oai.chat.completions.create(
        **kwargs, messages=messages, tools=[CHAT_SHELL], tool_choice=NAMED
    )
    choice = chat.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.type == "custom" and call.custom.name == "shell", call  # type: ignore[union-attr]
    assert re.fullmatch(REGEX, call.custom.input), call  # type: ignore[union-attr]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    oracle = oai.responses.create(
        **kwargs,
        instructions=messages[0]["content"],
        input=messages[1]["content"],
        tools=[SHELL],
        tool_choice={"type": "custom", "name": "shell"},
    )
    (made,) = oracle.output
    assert made.type == "custom_tool_call" and made.input == call.custom.input  # type: ignore[union-attr]
    assert chat.usage is not None and chat.usage.prompt_tokens == oracle.usage.input_tokens  # type: ignore[union-attr]
    # sent back with its result: the function call it was offered as, from the cache
    sent: Any = call.model_dump(exclude_none=True)
    history = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [sent]},
        {"role": "tool", "tool_call_id": call.id, "content": "a b"},
    ]
    second = oai.chat.completions.create(
        **kwargs, messages=history, tools=[CHAT_SHELL], max_tokens=1
    )
    function = {k: v for k, v in custom_tools.as_function(SHELL).items() if k != "custom"}
    fields = ("name", "description", "parameters")
    chat_tool = {"type": "function", "function": {k: function[k] for k in fields}}
    turn = {"name": "shell", "arguments": {"input": call.custom.input}}  # type: ignore[union-attr]
    rendered = [
        *messages,
        {"role": "assistant", "content": "", "tool_calls": [{"function": turn}]},
        {"role": "tool", "content": "a b"},
    ]
    tokenizer = AutoTokenizer.from_pretrained(tools_model_dir)
    text = tokenizer.apply_chat_template(
        rendered, tools=[chat_tool], add_generation_prompt=True, tokenize=False
    )
    assert second.usage is not None
    assert second.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= chat.usage.prompt_tokens + 10, second.usage  # the call


def test_a_streamed_custom_call_is_the_whole_calls(oai: openai.OpenAI) -> None:
    messages = _messages()
    kwargs: Any = dict(
        model=MODEL,
        messages=messages,
        tools=[CHAT_SHELL],
        tool_choice="required",
        temperature=0,
        parallel_tool_calls=False,
    )
    whole = oai.chat.completions.create(**kwargs).choices[0].message.tool_calls or []
    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    deltas = [t for c in chunks for ch in c.choices for t in ch.delta.tool_calls or []]
    (delta,) = deltas
    streamed = delta.model_dump()
    assert streamed["type"] == "custom" and streamed["index"] == 0
    assert streamed["custom"] == {"name": "shell", "input": whole[0].custom.input}  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_function_and_custom_tools_together_keep_their_kinds(oai: openai.OpenAI) -> None:
    # a function of the custom tool's shape: a random model's forced call then ends as soon
    function: Any = {
        "type": "function",
        "function": {"name": "read", "parameters": custom_tools.as_function(SHELL)["parameters"]},
    }
    for named, kind in (("read", "function"), ("shell", "custom")):
        choice = {"type": kind, kind: {"name": named}}
        out = oai.chat.completions.create(
            model=MODEL,
            messages=_messages(),
            tools=[function, CHAT_SHELL],
            tool_choice=choice,  # type: ignore[arg-type]
            temperature=0,
            parallel_tool_calls=False,
        )
        (call,) = out.choices[0].message.tool_calls or []
        assert call.type == kind, call


@pytest.mark.parametrize(
    "tool, wrong",
    [
        (
            {
                "type": "custom",
                "custom": {"name": "x", "format": {"type": "grammar", "grammar": {}}},
            },
            "lark or regex",
        ),
        (
            {
                "type": "custom",
                "custom": {
                    "name": "x",
                    "format": {
                        "type": "grammar",
                        "grammar": {"syntax": "regex", "definition": "("},
                    },
                },
            },
            "invalid regex",
        ),
        (
            {"type": "custom", "custom": {"name": "x", "format": {"type": "json"}}},
            "text or grammar",
        ),
        ({"type": "custom"}, "under custom"),
    ],
)
def test_a_bad_custom_tool_is_a_400_naming_it(oai: openai.OpenAI, tool: Any, wrong: str) -> None:
    with pytest.raises(openai.BadRequestError, match=wrong):
        oai.chat.completions.create(model=MODEL, messages=_messages(), tools=[tool], max_tokens=1)


def test_a_custom_call_without_its_input_is_a_400(oai: openai.OpenAI) -> None:
    call: Any = {"id": "c1", "type": "custom", "custom": {"name": "shell"}}
    history = [*_messages(), {"role": "assistant", "tool_calls": [call]}]
    with pytest.raises(openai.BadRequestError, match="custom.input"):
        oai.chat.completions.create(model=MODEL, messages=history, tools=[CHAT_SHELL], max_tokens=1)
