"""Tool calls without a server: the constraint schema of ``tool_choice`` (validated with
``jsonschema``, the reference validator) and the parsers of Qwen2.5's and Llama 3's formats,
whole and streamed in every split."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixserve.api.formats.tool_calls import (
    ParsedCall,
    ToolCallParser,
    detect_parser,
    parse_constrained,
    tool_choice_schema,
)
from radixserve.api.openai.chat_tools import plan_tools
from radixserve.api.openai.protocol import ChatCompletionRequest

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TIME = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
TOOLS = [("get_weather", WEATHER), ("get_time", TIME)]


def test_required_schema_accepts_calls_of_any_tool_and_nothing_else() -> None:
    schema = tool_choice_schema(TOOLS, None, parallel=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"name": "get_time", "parameters": {"tz": "UTC"}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "get_weather", "parameters": {"days": 3}}],  # city missing
        [{"name": "nope", "parameters": {}}],
        {"name": "get_time", "parameters": {"tz": "UTC"}},  # not an array
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert parse_constrained(json.dumps(good)) == [
        ParsedCall("get_weather", '{"city": "Paris"}'),
        ParsedCall("get_time", '{"tz": "UTC"}'),
    ]


def test_named_schema_allows_only_that_function_and_one_call_unless_parallel() -> None:
    schema = tool_choice_schema(TOOLS, "get_time", parallel=False)
    jsonschema.validate([{"name": "get_time", "parameters": {"tz": "CET"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {"city": "x"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        two = [{"name": "get_time", "parameters": {"tz": "CET"}}] * 2
        jsonschema.validate(two, schema)


def test_conflicting_defs_are_refused() -> None:
    a = {"$defs": {"X": {"type": "string"}}, "type": "object"}
    b = {"$defs": {"X": {"type": "integer"}}, "type": "object"}
    with pytest.raises(ValueError, match="defs"):
        tool_choice_schema([("a", a), ("b", b)], None, parallel=True)


QWEN_OUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)
LLAMA_OUT = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
    '{"name": "get_time", "parameters": {"tz": "CET"}}'
)
EXPECTED = [
    ParsedCall("get_weather", json.dumps({"city": "Paris", "days": 2})),
    ParsedCall("get_time", json.dumps({"tz": "CET"})),
]


@pytest.mark.parametrize(
    ("kind", "text", "content"), [("qwen25", QWEN_OUT, "Let me check."), ("llama3", LLAMA_OUT, "")]
)
def test_parsers_read_their_family_format(kind: str, text: str, content: str) -> None:
    assert ToolCallParser(kind).parse(text) == (content, EXPECTED)


def test_malformed_calls_stay_text() -> None:
    text = 'Sure <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    assert ToolCallParser("qwen25").parse(text) == (text, [])
    assert ToolCallParser("qwen25").parse("no calls here") == ("no calls here", [])
    assert ToolCallParser("llama3").parse("Paris is sunny.") == ("Paris is sunny.", [])


def _request(**kwargs: object) -> ChatCompletionRequest:
    tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in TOOLS]
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools, **kwargs}
    )


@pytest.mark.parametrize(("kind", "text"), [("qwen25", QWEN_OUT), ("llama3", LLAMA_OUT)])
def test_stream_in_every_split_equals_the_whole_parse(kind: str, text: str) -> None:
    plan = plan_tools(_request(tool_choice="auto"), kind)
    whole = plan.parse(text)
    for cut in range(len(text) + 1):
        for step in (1, 3, 7):
            stream = plan.stream()
            pieces = [text[:cut]] + [text[k : k + step] for k in range(cut, len(text), step)]
            sent = "".join(stream.feed(p) for p in pieces)
            rest, calls = stream.finish()
            assert calls == whole[1]
            assert (sent + rest).rstrip() == (whole[0] or "")


def test_stream_of_plain_text_loses_nothing() -> None:
    plan = plan_tools(_request(), "qwen25")
    text = "A <tool_ is not a call, <b> neither."
    stream = plan.stream()
    sent = "".join(stream.feed(c) for c in text)
    rest, calls = stream.finish()
    assert sent + rest == text and calls == []


def test_plan_refuses_bad_tool_choices() -> None:
    with pytest.raises(ValueError, match="not in tools"):
        plan_tools(_request(tool_choice={"type": "function", "function": {"name": "x"}}), "qwen25")
    with pytest.raises(ValueError, match="needs tools"):
        plan_tools(
            ChatCompletionRequest.model_validate(
                {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}
            ),
            "qwen25",
        )
    with pytest.raises(ValueError, match="response_format"):
        plan_tools(_request(tool_choice="required", response_format={"type": "json_object"}), "x")
    none = plan_tools(_request(tool_choice="none"), "qwen25")
    assert none.tools is None and not none.parses_calls


def test_detect_parser_from_the_template() -> None:
    assert detect_parser("... <tool_call> ...") == "qwen25"
    assert detect_parser("<|start_header_id|>...") == "llama3"
    assert detect_parser(None) == "qwen25"


MISTRAL_OUT = (
    'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
    '{"name": "get_time", "arguments": {"tz": "CET"}}]'
)


def test_mistral_format_and_sglang_names() -> None:
    assert ToolCallParser("mistral").parse(MISTRAL_OUT) == ("Checking.", EXPECTED)
    one = '[TOOL_CALLS] {"name": "get_time", "arguments": {"tz": "CET"}}'
    assert ToolCallParser("mistral").parse(one) == ("", EXPECTED[1:])
    broken = "[TOOL_CALLS] [{]"
    assert ToolCallParser("mistral").parse(broken) == (broken, [])
    assert ToolCallParser("qwen").kind == "qwen25"  # SGLang's other name for it
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    with pytest.raises(ValueError, match="mistral"):
        ToolCallParser("hermes2")


def test_mistral_stream_in_every_split_equals_the_whole_parse() -> None:
    plan = plan_tools(_request(tool_choice="auto"), "mistral")
    whole = plan.parse(MISTRAL_OUT)
    assert whole[1] == EXPECTED
    for cut in range(len(MISTRAL_OUT) + 1):
        stream = plan.stream()
        sent = stream.feed(MISTRAL_OUT[:cut]) + stream.feed(MISTRAL_OUT[cut:])
        rest, calls = stream.finish()
        assert calls == whole[1] and (sent + rest).rstrip() == whole[0]
