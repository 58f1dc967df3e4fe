"""Context editing through Anthropic's Messages door, with the official ``anthropic`` client's
beta surface: a ``clear_tool_uses_20250919`` edit's prompt is the conversation with those
results replaced by hand (the oracle: that conversation counted and run by the same door),
the response and the stream report it in ``context_management.applied_edits``, a count reports
``original_input_tokens``, and an edit under its trigger or short of ``clear_at_least`` leaves
the prompt whole. The clearing itself against a naive reference: ``test_anthropic_clearing.py``;
thinking through Qwen3's real template: ``test_real_checkpoints.py``."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import pytest
from serving_harness import anthropic_message, prompt_tokens
from test_server_tools import MODEL

from radixserve.api.anthropic.clearing import PLACEHOLDER

pytestmark = pytest.mark.timeout(180)

BETAS: Any = ["context-management-2025-06-27"]
TOOLS: Any = [
    {"name": name, "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
    for name in ("read", "ls")
]


ROWS = "".join(f"row {i}: ok\n" for i in range(15))  # a tool's output: 115 of these tokens


def _loop(uses: int, result: str = ROWS, cleared: int = 0, inputs: bool = False) -> Any:
    """A task, then ``uses`` tool calls and their results; the first ``cleared`` results (and
    their inputs, with ``inputs``) replaced as the edit replaces them."""
    out: list[Any] = [{"role": "user", "content": f"Agent {uuid.uuid4().hex}: read the files."}]
    for k in range(uses):
        gone = k < cleared
        name = "ls" if k == 1 else "read"
        args = {} if gone and inputs else {"path": f"src/file_{k}.py"}
        call = {"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": args}
        text = PLACEHOLDER if gone else f"{result}{k}"
        back = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": text}
        out += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [back]}]
    return out


def _as(loop: Any, template: Any) -> Any:
    """``template`` (a :func:`_loop` of other clearing) with ``loop``'s task, so both are one
    conversation."""
    return [loop[0], *template[1:]]


def _clear(**fields: Any) -> Any:
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100}}
    return {"edits": [{**edit, **fields}]}


def _count(claude: anthropic.Anthropic, messages: Any, **kwargs: Any) -> Any:
    return claude.beta.messages.count_tokens(
        model=MODEL, messages=messages, tools=TOOLS, betas=BETAS, **kwargs
    )


@pytest.mark.parametrize("stream", [False, True])
def test_old_tool_results_are_cleared_as_by_hand(claude: anthropic.Anthropic, stream: bool) -> None:
    loop = _loop(5)
    by_hand = _as(loop, _loop(5, cleared=3))
    whole, hand = _count(claude, loop).input_tokens, _count(claude, by_hand).input_tokens
    assert hand < whole - 3 * 30, (hand, whole)
    edit = _clear(keep={"type": "tool_uses", "value": 2})
    counted = _count(claude, loop, context_management=edit)
    assert counted.input_tokens == hand
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == whole
    kwargs: Any = dict(model=MODEL, tools=TOOLS, max_tokens=6, extra_body={"temperature": 0})
    # the cleared prompt cached first, so both answers compared below reuse it (a cold
    # prefill and a prefix hit round differently: a random model's near tie may flip)
    claude.messages.create(**{**kwargs, "max_tokens": 1}, messages=by_hand)
    msg = anthropic_message(
        claude.beta.messages, stream, **kwargs, messages=loop, context_management=edit, betas=BETAS
    )
    assert msg.context_management is not None
    (applied,) = msg.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919"
    assert applied.cleared_tool_uses == 3  # type: ignore[union-attr]
    assert applied.cleared_input_tokens == whole - hand
    assert prompt_tokens(msg) == hand
    assert (msg.usage.cache_read_input_tokens or 0) >= hand - 1, msg.usage
    # the same prompt as the conversation cleared by hand: the same greedy answer
    plain = claude.messages.create(**kwargs, messages=by_hand)
    assert [b.model_dump(exclude={"id"}) for b in plain.content] == [
        b.model_dump(exclude={"id"}) for b in msg.content
    ]
    assert (plain.usage.cache_read_input_tokens or 0) >= hand - 1, plain.usage


def test_inputs_excluded_tools_and_what_leaves_the_prompt_whole(
    claude: anthropic.Anthropic,
) -> None:
    loop = _loop(3)
    whole = _count(claude, loop).input_tokens
    inputs = _count(claude, _as(loop, _loop(3, cleared=2, inputs=True))).input_tokens
    keep1: Any = {"keep": {"type": "tool_uses", "value": 1}}
    assert _count(claude, loop, context_management=_clear(**keep1, clear_tool_inputs=True)) == (
        _count(claude, loop, context_management=_clear(**keep1, clear_tool_inputs=["read", "ls"]))
    )
    counted = _count(claude, loop, context_management=_clear(**keep1, clear_tool_inputs=True))
    assert counted.input_tokens == inputs < whole
    # clear_at_least: applied where it clears that many, not where it would clear fewer
    enough: Any = {"type": "input_tokens", "value": whole - inputs}
    edit = _clear(**keep1, clear_tool_inputs=True, clear_at_least=enough)
    assert _count(claude, loop, context_management=edit).input_tokens == inputs
    # the second use is of ``ls``: excluded, its result stays
    excluded = _loop(3, cleared=2)
    excluded[4] = loop[4]
    counted = _count(claude, loop, context_management=_clear(**keep1, exclude_tools=["ls"]))
    assert counted.input_tokens == _count(claude, _as(loop, excluded)).input_tokens
    # under the trigger, or clearing less than clear_at_least: the prompt as sent
    for edit in (
        _clear(**keep1, trigger={"type": "input_tokens", "value": whole}),
        _clear(**keep1, trigger={"type": "tool_uses", "value": 3}),
        _clear(**keep1, clear_at_least={"type": "input_tokens", "value": whole - inputs + 1}),
    ):
        counted = _count(claude, loop, context_management=edit)
        assert counted.input_tokens == whole, edit
        msg = claude.beta.messages.create(
            model=MODEL, tools=TOOLS, messages=loop, max_tokens=1, betas=BETAS,
            context_management=edit,
        )  # fmt: skip
        assert msg.context_management is not None and msg.context_management.applied_edits == []
        assert prompt_tokens(msg) == whole


def test_clearing_brings_a_conversation_past_the_context_under_it(
    claude: anthropic.Anthropic,
) -> None:
    """The tiny model's context is 1,024 tokens: the whole loop is past it, the cleared one
    runs whole (this server would otherwise truncate it: ``--allow-auto-truncate``)."""
    loop = _loop(6)
    hand = _count(claude, _as(loop, _loop(6, cleared=4))).input_tokens
    assert _count(claude, loop).input_tokens > 1024 > hand
    edit = _clear(keep={"type": "tool_uses", "value": 2})
    msg = claude.beta.messages.create(
        model=MODEL, tools=TOOLS, messages=loop, max_tokens=2, betas=BETAS, context_management=edit
    )
    assert prompt_tokens(msg) == hand
    assert msg.context_management is not None
    assert [e.cleared_tool_uses for e in msg.context_management.applied_edits] == [4]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "edits, match",
    [
        ([{"type": "clear_everything"}], "clear_everything"),
        ([{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}], "first"),
        ([{"type": "clear_tool_uses_20250919", "keep": {"type": "turns", "value": 1}}], "keep"),
    ],
)
def test_a_malformed_edit_is_a_400_naming_it(
    claude: anthropic.Anthropic, edits: Any, match: str
) -> None:
    for call in (claude.beta.messages.create, claude.beta.messages.count_tokens):
        kwargs: Any = {} if call == claude.beta.messages.count_tokens else {"max_tokens": 1}
        with pytest.raises(anthropic.BadRequestError, match=match) as err:
            call(
                model=MODEL, messages=_loop(1), betas=BETAS, context_management={"edits": edits},
                **kwargs,
            )  # fmt: skip
        assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
