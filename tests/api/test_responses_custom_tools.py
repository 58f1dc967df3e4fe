"""Custom tools (``type: "custom"``) through the Responses API, with the official ``openai``
client and the Agents SDK's ``CustomTool``: a call carries one raw string (a regex format
constrains a forced one), streamed as ``custom_tool_call_input`` events, and sent back with
its output it renders as the function of one string parameter it was offered as (the oracle:
transformers' template and tokenizer), the call read back from the cache."""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from serving_harness import Server
from test_server_tools import MODEL

from radixserve.api.formats import custom_tools

pytestmark = pytest.mark.timeout(180)

REGEX = "[a-z]{2,6}"
SHELL: Any = {
    "type": "custom",
    "name": "shell",
    "description": "Runs a command.",
    "format": {"type": "grammar", "syntax": "regex", "definition": REGEX},
}
NAMED_SHELL: Any = {"type": "custom", "name": "shell"}
FUNCTION_FIELDS = ("name", "description", "parameters")


def test_a_forced_custom_call_and_its_output_render_as_the_function_offered(
    oai: openai.OpenAI, tools_model_dir: Path
) -> None:
    """The oracle: transformers' template and tokenizer, rendering the conversation with the
    function of one string parameter the custom tool is offered as."""
    from transformers import AutoTokenizer

    kwargs: Any = dict(model=MODEL, tools=[SHELL], temperature=0, parallel_tool_calls=False)
    system, user = f"You are agent {uuid.uuid4().hex}.", "List the files."
    first = oai.responses.create(**kwargs, instructions=system, input=user, tool_choice=NAMED_SHELL)
    (call,) = first.output
    assert call.type == "custom_tool_call" and call.name == "shell", first.output
    assert re.fullmatch(REGEX, call.input), call.input
    assert call.call_id and call.status == "completed"
    back: Any = [{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "a b"}]
    second = oai.responses.create(
        **kwargs,
        instructions=system,
        previous_response_id=first.id,
        input=back,
        max_output_tokens=1,
    )
    function = {k: v for k, v in custom_tools.as_function(SHELL).items() if k != "custom"}
    chat_tool = {"type": "function", "function": {k: function[k] for k in FUNCTION_FIELDS}}
    turn = {"name": "shell", "arguments": {"input": call.input}}
    messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    before = len(messages)
    messages.append({"role": "assistant", "content": "", "tool_calls": [{"function": turn}]})
    messages.append({"role": "tool", "content": "a b"})
    tokenizer = AutoTokenizer.from_pretrained(tools_model_dir)
    prompt, again = (
        tokenizer.encode(
            tokenizer.apply_chat_template(
                m, tools=[chat_tool], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for m in (messages[:before], messages)
    )
    assert (first.usage.input_tokens, second.usage.input_tokens) == (len(prompt), len(again))
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens + 10, (first.usage, second.usage)  # the call
    # listed as the client sent them and the model wrote them
    listed = oai.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in listed][-2:] == ["custom_tool_call", "custom_tool_call_output"]


def test_a_streamed_custom_call_sends_its_input_events(oai: openai.OpenAI) -> None:
    with oai.responses.stream(
        model=MODEL,
        instructions=f"You are agent {uuid.uuid4().hex}.",
        input="List the files.",
        tools=[SHELL],
        tool_choice="required",
        parallel_tool_calls=False,
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    final = events[-1].response  # type: ignore[union-attr]
    assert kinds[-1] == "response.completed", kinds
    (call,) = [item for item in final.output if item.type == "custom_tool_call"]
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert done.input == "".join(deltas) == call.input and done.item_id == call.id
    assert re.fullmatch(REGEX, call.input)
    assert "response.function_call_arguments.delta" not in kinds


@pytest.mark.parametrize(
    "fmt, wrong",
    [
        ({"type": "grammar", "syntax": "python", "definition": "x"}, "lark or regex"),
        ({"type": "grammar", "syntax": "regex", "definition": "(a"}, "invalid regex"),
        ({"type": "json"}, "text or grammar"),
    ],
)
def test_a_bad_format_is_a_400_naming_it(oai: openai.OpenAI, fmt: Any, wrong: str) -> None:
    tool = {**copy.deepcopy(SHELL), "format": fmt}
    with pytest.raises(openai.BadRequestError, match=wrong):
        oai.responses.create(model=MODEL, input="hi", tools=[tool], max_output_tokens=1)


@pytest.mark.parametrize("text", ["", "ls -la", 'say "hi"\n\tdone', "unicode é ✓"])
def test_an_input_is_the_arguments_string_and_back(text: str) -> None:
    assert custom_tools.call_input(custom_tools.call_arguments(text)) == text
    assert custom_tools.call_input("not json") == "not json"  # what the model wrote, kept
    assert custom_tools.call_input('{"other": 1}') == '{"other": 1}'


def test_an_agent_runs_its_custom_tool(compat_server: Server) -> None:
    """The Agents SDK's ``CustomTool``: the forced call's raw input reaches the tool. (The SDK
    ends a run on a function tool's output only, and would ask the random model again: one
    turn is run, and the run ends there.)"""
    agents = pytest.importorskip("agents", reason="needs openai-agents (the test extra)")
    from test_agents_sdk import _agent

    seen: list[str] = []

    async def run_shell(context: Any, raw_input: str) -> str:
        seen.append(raw_input)
        return "a.txt b.txt"

    tool = agents.CustomTool(
        name="shell",
        description="Runs a command.",
        on_invoke_tool=run_shell,
        format={"type": "grammar", "syntax": "regex", "definition": REGEX},
    )
    settings = agents.ModelSettings(
        tool_choice="required", parallel_tool_calls=False, max_tokens=64
    )
    agent = _agent(compat_server, tools=[tool], model_settings=settings)
    with pytest.raises(agents.MaxTurnsExceeded) as ended:
        asyncio.run(agents.Runner.run(agent, "List the files.", max_turns=1))
    assert len(seen) == 1 and re.fullmatch(REGEX, seen[0]), seen
    run = ended.value.run_data
    assert run is not None
    kinds = [item.type for item in run.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"], kinds
    assert run.new_items[1].raw_item["type"] == "custom_tool_call_output"


def test_the_sdks_patch_tool_is_offered_with_its_grammar_described(oai: openai.OpenAI) -> None:
    """The Agents SDK's sandbox ``apply_patch`` (a custom tool with a Lark grammar) is taken:
    its grammar is in the prompt the model reads (counted), and a forced call is a
    ``custom_tool_call`` of a string input."""
    pytest.importorskip("agents", reason="needs openai-agents (the test extra)")
    from agents.sandbox.capabilities.tools.apply_patch_tool import SandboxApplyPatchTool

    patch: Any = SandboxApplyPatchTool(session=None).tool_config  # type: ignore[arg-type]
    patch = {**patch, "description": "Applies a patch."}  # its own is past the tiny context
    plain = {**patch, "format": {"type": "text"}}
    counts = [
        oai.responses.input_tokens.count(model=MODEL, input="Fix it.", tools=[tool]).input_tokens
        for tool in (patch, plain)
    ]
    grammar = patch["format"]["definition"]
    assert counts[0] > counts[1] + len(grammar) // 8, counts  # the definition is read
    response = oai.responses.create(
        model=MODEL,
        instructions=f"You are agent {uuid.uuid4().hex}.",
        input="Fix it.",
        tools=[patch],
        tool_choice={"type": "custom", "name": "apply_patch"},
        parallel_tool_calls=False,
        max_output_tokens=256,
    )
    calls = [item for item in response.output if item.type == "custom_tool_call"]
    assert response.status == "incomplete" or (
        len(calls) == 1 and calls[0].name == "apply_patch" and isinstance(calls[0].input, str)
    ), response.output
