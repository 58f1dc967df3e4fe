"""The clearing edits of Anthropic's ``context_management`` on generated conversations, against
a naive reference written from the documentation: which tool results (and inputs) and which
turns' thinking go, and that nothing else changes. Through the server and the official client:
``test_anthropic_context_edits.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from radixserve.api.anthropic import clearing
from radixserve.api.anthropic.edits import ClearThinking, ClearToolUses, ContextManagement
from radixserve.api.anthropic.protocol import MessagesRequest

pytestmark = pytest.mark.timeout(120)

TOOLS = ["ls", "read", "grep"]


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A user's task, then turns of an assistant (maybe thinking, text, some tool uses) and
    the user's results for them (or text)."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "Do the task."}]
    for turn in range(draw(st.integers(0, 6))):
        content: list[dict[str, Any]] = []
        if draw(st.booleans()):
            content.append({"type": "thinking", "thinking": f"thought {turn}", "signature": ""})
        if draw(st.booleans()):
            content.append({"type": "text", "text": f"text {turn}"})
        uses = [
            {"type": "tool_use", "id": f"t{turn}_{k}", "name": draw(st.sampled_from(TOOLS))}
            | {"input": {"path": f"p{turn}{k}"} if draw(st.booleans()) else {}}
            for k in range(draw(st.integers(0, 3)))
        ]
        out.append({"role": "assistant", "content": content + uses})
        if uses:
            results = [
                {"type": "tool_result", "tool_use_id": use["id"], "content": f"result {use['id']}"}
                for use in uses
            ]
            out.append({"role": "user", "content": results})
        else:
            out.append({"role": "user", "content": f"next {turn}"})
    return out


def _body(messages: list[dict[str, Any]], edits: list[dict[str, Any]]) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 1,
            "messages": messages,
            "context_management": {"edits": edits},
        }
    )


def _dump(body: MessagesRequest) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True, exclude_defaults=True) for m in body.messages]


def _reference_tool_uses(
    messages: list[dict[str, Any]], keep: int, exclude: set[str], inputs: bool | list[str]
) -> tuple[list[dict[str, Any]], int]:
    """Every use but the last ``keep`` and those of ``exclude``: its result the placeholder,
    its input ``{}`` where ``inputs`` names it; the number of uses where that changed
    something."""
    uses = [
        b
        for m in messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    cleared = {u["id"]: u["name"] for u in uses[: max(len(uses) - keep, 0)]}
    cleared = {i: n for i, n in cleared.items() if n not in exclude}
    changed: set[str] = set()
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            new = []
            for b in content:
                if b["type"] == "tool_result" and b["tool_use_id"] in cleared:
                    b = {**b, "content": clearing.PLACEHOLDER}
                    changed.add(b["tool_use_id"])
                wants = inputs is True or (isinstance(inputs, list) and b.get("name") in inputs)
                if b["type"] == "tool_use" and b["id"] in cleared and wants and b["input"]:
                    b = {**b, "input": {}}
                    changed.add(b["id"])
                new.append(b)
            content = new
        out.append({**m, "content": content})
    return out, len(changed)


def _reference_thinking(
    messages: list[dict[str, Any]], keep: int | None
) -> tuple[list[dict[str, Any]], int]:
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    older = turns[: len(turns) - keep] if keep is not None and keep < len(turns) else []
    out, cleared = [], 0
    for i, m in enumerate(messages):
        if i in older and any(b["type"] == "thinking" for b in m["content"]):
            m = {**m, "content": [b for b in m["content"] if b["type"] != "thinking"]}
            cleared += 1
        out.append(m)
    return out, cleared


def _normal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reference's messages as the protocol dumps them (defaults left out)."""
    return _dump(_body(messages, []))


@settings(max_examples=150, deadline=None)
@given(
    conversations(),
    st.integers(0, 5),
    st.sets(st.sampled_from(TOOLS), max_size=2),
    st.one_of(st.booleans(), st.lists(st.sampled_from(TOOLS), max_size=2)),
)
def test_clearing_tool_uses_matches_the_reference(
    messages: list[dict[str, Any]], keep: int, exclude: set[str], inputs: bool | list[str]
) -> None:
    edit: dict[str, Any] = {
        "type": "clear_tool_uses_20250919",
        "keep": {"type": "tool_uses", "value": keep},
        "exclude_tools": sorted(exclude),
        "clear_tool_inputs": inputs,
    }
    body = _body(messages, [edit])
    assert body.context_management is not None
    (parsed,) = body.context_management.clearing()
    assert isinstance(parsed, ClearToolUses)
    got, count = clearing.clear_tool_uses(body.messages, parsed)
    want, want_count = _reference_tool_uses(messages, keep, exclude, inputs)
    assert [m.model_dump(exclude_none=True, exclude_defaults=True) for m in got] == _normal(want)
    assert count == want_count
    again, twice = clearing.clear_tool_uses(got, parsed)  # a cleared conversation stays
    assert again == got and twice == 0


@settings(max_examples=150, deadline=None)
@given(conversations(), st.one_of(st.none(), st.integers(0, 4)))
def test_clearing_thinking_matches_the_reference(
    messages: list[dict[str, Any]], keep: int | None
) -> None:
    kept: Any = "all" if keep is None else {"type": "thinking_turns", "value": keep}
    body = _body(messages, [{"type": "clear_thinking_20251015", "keep": kept}])
    assert body.context_management is not None
    (parsed,) = body.context_management.clearing()
    assert isinstance(parsed, ClearThinking)
    got, count = clearing.clear_thinking(body.messages, parsed.turns_kept())
    want, want_count = _reference_thinking(messages, keep)
    assert [m.model_dump(exclude_none=True, exclude_defaults=True) for m in got] == _normal(want)
    assert count == want_count


def test_apply_reports_each_edit_and_honours_the_trigger_and_clear_at_least() -> None:
    """:func:`clearing.apply` with a stand-in renderer (a token per character): an edit past
    its trigger is applied and reported with what it saved; under it, or saving less than
    ``clear_at_least``, it is not."""
    result = "x" * 200
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for k in range(4):
        use = {"type": "tool_use", "id": f"t{k}", "name": "ls", "input": {}}
        messages += [
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}"}]},
        ]
        messages[-1]["content"][0]["content"] = result

    def tokens(body: MessagesRequest) -> int:
        return sum(len(m.model_dump_json()) for m in body.messages)

    async def count(body: MessagesRequest) -> list[int]:
        return [0] * tokens(body)

    def run(edits: list[dict[str, Any]]) -> clearing.Edited:
        return asyncio.run(clearing.apply(_body(messages, edits), count))

    whole = tokens(_body(messages, []))
    thinking = {"type": "clear_thinking_20251015"}
    tools = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10}}
    edited = run([thinking, tools])
    assert [e["type"] for e in edited.applied] == [thinking["type"], tools["type"]]
    assert edited.applied[0]["cleared_thinking_turns"] == 3
    assert edited.applied[1]["cleared_tool_uses"] == 1  # keep: 3 of the 4
    assert edited.original_tokens == whole
    assert edited.prompt is not None
    saved = sum(e["cleared_input_tokens"] for e in edited.applied)
    assert len(edited.prompt) == whole - saved and saved > 200 - len(clearing.PLACEHOLDER)
    under = {**tools, "trigger": {"type": "input_tokens", "value": whole}}
    assert run([under]).applied == [] and run([under]).prompt == [0] * whole
    uses = {**tools, "trigger": {"type": "tool_uses", "value": 3}}
    assert [e["cleared_tool_uses"] for e in run([uses]).applied] == [1]
    assert run([{**uses, "trigger": {"type": "tool_uses", "value": 4}}]).applied == []
    much = {**tools, "clear_at_least": {"type": "input_tokens", "value": 10_000}}
    assert run([much]).applied == []
    assert asyncio.run(clearing.apply(_body(messages, []), count)).prompt is None


@pytest.mark.parametrize(
    "edits, match",
    [
        ([{"type": "clear_everything"}], "clear_everything"),
        ([{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}], "first"),
        ([{"type": "clear_tool_uses_20250919"}] * 2, "more than once"),
        (
            [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}],
            "keep",
        ),
        ([{"type": "clear_thinking_20251015", "keep": "some"}], "keep"),
        (
            [{"type": "clear_tool_uses_20250919", "trigger": {"type": "turns", "value": 3}}],
            "trigger",
        ),
        (
            [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 0}}],
            "trigger",
        ),
    ],
)
def test_a_malformed_edit_is_refused_naming_it(edits: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        ContextManagement.model_validate({"edits": edits})
