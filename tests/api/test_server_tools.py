"""Tools and structured output through the official ``openai`` client against a real server
(``compat_server``: a tokenizer whose template renders tools). Outputs are checked with the
reference validators (``jsonschema``, ``re.fullmatch``)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MODEL = "tiny-tools"


def _messages() -> list[Any]:
    # a system prompt of its own, so no other test's cache entries count here
    return [
        {"role": "system", "content": f"You are agent {uuid.uuid4().hex}."},
        {"role": "user", "content": "What is the weather in Paris for the next 2 days?"},
    ]


def test_agent_loop_history_with_tool_calls_hits_the_prefix_cache(oai: openai.OpenAI) -> None:
    """Each turn's prompt renders the previous one's (tools, the assistant's tool_calls and
    the tool results kept in the history), so its cached prefix grows turn by turn."""
    messages = _messages()
    prompts, cached = [], []
    for turn in range(4):
        resp = oai.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, temperature=0
        )
        prompts.append(resp.usage.prompt_tokens)
        cached.append(resp.usage.prompt_tokens_details.cached_tokens)
        call_id = f"call_{turn}"
        arguments = json.dumps({"city": "Paris", "days": turn + 1})
        call = {"id": call_id, "type": "function"}
        call["function"] = {"name": "get_weather", "arguments": arguments}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": f"sunny, {20 + turn} C"}
        )
    assert cached[0] < prompts[0]
    for t in range(1, len(prompts)):
        assert prompts[t] > prompts[t - 1] + 10  # the call and its result are rendered
        # the whole previous prompt is cached, but for a token or two where BPE merges
        # across the boundary of the new text
        assert prompts[t - 1] - 3 <= cached[t] < prompts[t], (prompts, cached)
    assert cached == sorted(cached) and cached[-1] > cached[1]


def test_tool_choice_none_does_not_render_the_tools(oai: openai.OpenAI) -> None:
    messages = _messages()
    with_tools = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=1
    )
    none = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=1
    )
    plain = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None


# ---- with the grammar engine ---------------------------------------------------------------


def _check_calls(calls: Any, only: str | None = None) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id
        assert only is None or call.function.name == only
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_choice_required_and_named_return_valid_calls(oai: openai.OpenAI, choice: str) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    tool_choice: Any = named if choice == "named" else "required"
    only = "get_time" if choice == "named" else None
    kwargs: Any = dict(model=MODEL, messages=_messages(), tools=TOOLS, tool_choice=tool_choice)
    # one call each: a random model may go on adding calls to the array past any max_tokens
    kwargs["parallel_tool_calls"] = False
    resp = oai.chat.completions.create(**kwargs, max_tokens=256, temperature=1.0, n=2)
    for c in resp.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        _check_calls(c.message.tool_calls, only)
    # streamed: OpenAI's deltas (tool_calls[index]) assembled by the client's own helper
    with oai.chat.completions.stream(**kwargs, max_tokens=256, temperature=1.0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    _check_calls(final.choices[0].message.tool_calls, only)


FIXED = {
    "type": "object",
    "properties": {"tz": {"const": "UTC"}},
    "required": ["tz"],
    "additionalProperties": False,
}


def test_a_forced_call_is_written_in_the_templates_own_tokens(
    oai: openai.OpenAI, tools_model_dir: Path
) -> None:
    """A forced call is written in the template's own words (``call_form.py``): token for
    token what the template renders back in the next turn's prompt, against the template and
    tokenizer themselves (a call written as a JSON array is rendered otherwise)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tools_model_dir)
    tools: Any = [{"type": "function", "function": {"name": "utc_time", "parameters": FIXED}}]
    named: Any = {"type": "function", "function": {"name": "utc_time"}}
    messages = _messages()
    first = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, tool_choice=named, logprobs=True
    )
    written = [t.token for t in first.choices[0].logprobs.content]
    if written[-1] in ("<|im_end|>", "<|endoftext|>"):  # the model's end of turn: either EOS
        written.pop()
    (call,) = first.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"tz": "UTC"}
    turn = {"name": "utc_time", "arguments": {"tz": "UTC"}}
    after = [{"role": "assistant", "content": "", "tool_calls": [{"function": turn}]}]
    after.append({"role": "tool", "content": "sunny"})
    prompt, again = (
        tokenizer.encode(
            tokenizer.apply_chat_template(
                m, tools=tools, add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for m in (messages, messages + after)
    )
    assert again[: len(prompt)] == prompt
    rendered = [tokenizer.decode([t]) for t in again[len(prompt) :]]
    assert written == rendered[: len(written)], (written, rendered)
    assert rendered[len(written)] == "<|im_end|>"  # the whole call, then the end of the turn


def test_a_required_calls_opening_is_found_cached_in_the_next_turn(oai: openai.OpenAI) -> None:
    """The next turn renders a required call back: its prompt finds the call's opening cached
    (the grammar fixes it; a random model's choices after it may be tokens the tokenizer would
    not write, and what the grammar forces at the end was never computed)."""
    messages = _messages()
    kwargs: Any = dict(model=MODEL, tools=TOOLS, parallel_tool_calls=False)
    first = oai.chat.completions.create(
        **kwargs, messages=messages, tool_choice="required", max_tokens=256, temperature=0
    )
    calls = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls", first
    _check_calls(calls, None)
    messages.append({"role": "assistant", "content": None, "tool_calls": calls})
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"})
    second = oai.chat.completions.create(**kwargs, messages=messages, max_tokens=1)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # '\n<tool_call>\n{"name": "' is 13 tokens of this tokenizer
    assert cached >= first.usage.prompt_tokens + 10, (first.usage, second.usage)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_parses_the_models_own_tool_call_format(oai: openai.OpenAI, stream: bool) -> None:
    """A regex makes the random model write Qwen's format; ``auto`` parses it into calls."""
    regex = (
        r'I will check\.\n<tool_call>\n\{"name": "get_time", "arguments": \{"tz": "(UTC|CET)"\}\}'
        r"\n</tool_call>"
    )
    kwargs: Any = dict(model=MODEL, messages=_messages(), tools=TOOLS, max_tokens=128)
    kwargs["extra_body"] = {"regex": regex}
    if not stream:
        choice = oai.chat.completions.create(**kwargs).choices[0]
        message, finish = choice.message, choice.finish_reason
    else:
        with oai.chat.completions.stream(**kwargs) as s:
            for _ in s:
                pass
            final = s.get_final_completion().choices[0]
        message, finish = final.message, final.finish_reason
    assert finish == "tool_calls"
    assert message.content == "I will check."
    _check_calls(message.tool_calls, "get_time")


def test_response_format_json_schema_returns_json_that_validates(oai: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    resp = oai.chat.completions.create(
        model=MODEL, messages=_messages(), response_format=fmt, max_tokens=128, n=3
    )
    for c in resp.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content or ""), schema)
    # any object: a random model may write free keys past the limit, so only a finished
    # output must parse (a cut one is the start of an object)
    obj = oai.chat.completions.create(
        model=MODEL,
        messages=_messages(),
        response_format={"type": "json_object"},
        max_tokens=128,
        n=4,
    )
    for c in obj.choices:
        assert (c.message.content or "").startswith("{")
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content or ""), dict)
        else:
            assert c.finish_reason == "length"


def test_generate_regex_and_json_schema_object(http: httpx.Client) -> None:
    regex = r"(yes|no), [a-z]{2,5}"
    body: Any = {
        "text": ["Q: a?", "Q: b?"],
        "sampling_params": {"regex": regex, "max_new_tokens": 32},
    }
    for out in http.post("/generate", json=body).json():
        assert re.fullmatch(regex, out["text"]), out
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "enum": [1, 2]}},
        "required": ["n"],
        "additionalProperties": False,  # else a random model may write free keys past the limit
    }
    body = {"text": "JSON:", "sampling_params": {"json_schema": schema, "max_new_tokens": 64}}
    jsonschema.validate(json.loads(http.post("/generate", json=body).json()["text"]), schema)


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        ({"regex": "(unclosed"}, "regex"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "schema",
        ),
    ],
)
def test_invalid_regex_or_schema_is_a_400_and_the_server_keeps_serving(
    http: httpx.Client, extra: dict[str, Any], word: str
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert word in resp.json()["error"]["message"]
    ok = http.post("/v1/chat/completions", json={**body, **{k: None for k in extra}})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def test_tokenize_renders_tools_as_the_chat_route_does(
    http: httpx.Client, oai: openai.OpenAI, tools_model_dir: Path
) -> None:
    """vLLM's ``/tokenize`` with ``messages``, ``tools`` and ``chat_template_kwargs``: the ids
    the template and tokenizer give (transformers' own render), as many as the chat route's
    prompt; ``tools`` without ``messages`` is a 400."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tools_model_dir)
    messages = _messages()
    body = {"messages": messages, "tools": TOOLS, "chat_template_kwargs": {"unused_flag": 1}}
    got = http.post("/tokenize", json=body)
    assert got.status_code == 200, got.text
    text = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert got.json()["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    chat = oai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=1)
    assert got.json()["count"] == chat.usage.prompt_tokens
    plain = http.post("/tokenize", json={"messages": messages}).json()["count"]
    assert plain < chat.usage.prompt_tokens  # the tools are rendered
    refused = http.post("/tokenize", json={"prompt": "hi", "tools": TOOLS})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"


@pytest.mark.parametrize("allowed", ["get_time", "get_weather"])
def test_allowed_tools_render_every_tool_and_call_only_the_allowed(
    oai: openai.OpenAI, allowed: str
) -> None:
    """OpenAI's ``allowed_tools``: the prompt is the one every tool renders (the same whichever
    are allowed: a cache hit), and a required call is one of the allowed; on the Responses
    door too."""
    messages = _messages()
    kwargs: Any = dict(model=MODEL, messages=messages, tools=TOOLS)
    plain = oai.chat.completions.create(**kwargs, tool_choice="auto", max_tokens=1)
    choice: Any = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": allowed}}],
        },
    }
    first = oai.chat.completions.create(
        **kwargs, tool_choice=choice, parallel_tool_calls=False, max_tokens=256
    )
    _check_calls(first.choices[0].message.tool_calls, allowed)
    assert first.usage.prompt_tokens == plain.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens >= plain.usage.prompt_tokens - 3
    flat: Any = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "parameters": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    response = oai.responses.create(
        model=MODEL,
        input="Check.",
        tools=flat,
        tool_choice={
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "function", "name": allowed}],
        },
        parallel_tool_calls=False,
        max_output_tokens=256,
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == allowed
    unknown: Any = {
        **choice,
        "allowed_tools": {
            "mode": "auto",
            "tools": [{"type": "function", "function": {"name": "nope"}}],
        },
    }
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        oai.chat.completions.create(**kwargs, tool_choice=unknown, max_tokens=1)
