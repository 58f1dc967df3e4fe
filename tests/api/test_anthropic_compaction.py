"""Compaction through Anthropic's Messages door, with the official ``anthropic`` client: a
``compaction`` request returns the summary alone (the oracle: the chat route asked for it after
the same conversation), a ``compact_20260112`` edit compacts a conversation past its trigger
before answering, and a ``compaction`` block sent back stands in for the messages before it,
the next turn reading the compacted conversation from the cache."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import openai
import pytest
from serving_harness import anthropic_message, prompt_tokens
from test_server_tools import MODEL

from radixserve.api import summary

pytestmark = pytest.mark.timeout(180)

RESULT = "file-" * 250  # a long tool result: the compacted conversation is shorter
BETAS: Any = ["compact-2026-01-12"]


def _conversation() -> list[Any]:
    call: Any = {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}
    result: Any = {"type": "tool_result", "tool_use_id": "t1", "content": RESULT}
    return [
        {"role": "user", "content": "Look at the files."},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
        {"role": "assistant", "content": "There are many files."},
        {"role": "user", "content": "Which is largest?"},
    ]


def _edit(value: int, pause: bool = False) -> Any:
    trigger = {"type": "input_tokens", "value": value}
    edit = {"type": "compact_20260112", "trigger": trigger, "pause_after_compaction": pause}
    return {"edits": [edit]}


def test_a_compaction_request_returns_the_models_summary_alone(
    claude: anthropic.Anthropic, oai: openai.OpenAI
) -> None:
    system = f"You are agent {uuid.uuid4().hex}."
    messages: Any = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Look at the files."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": RESULT},
        {"role": "assistant", "content": "There are many files."},
        {"role": "user", "content": "Which is largest?"},
        summary.ask(),
    ]
    # the summary's prompt cached first, so both compared below reuse it: a cold prefill and
    # a prefix hit round differently, and a random model's greedy pick can flip at a near tie
    oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=1)
    msg = claude.beta.messages.create(
        model=MODEL,
        system=system,
        messages=_conversation(),
        max_tokens=64,
        compaction={"type": "summarize"},
        extra_body={"temperature": 0},  # this client no longer offers it
        betas=BETAS,
    )
    assert msg.stop_reason == "compaction" and [b.type for b in msg.content] == ["compaction"]
    tokens = msg.usage.output_tokens
    chat = oai.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=tokens
    )
    assert msg.content[0].content == (chat.choices[0].message.content or "")  # type: ignore[union-attr]
    assert tokens == chat.usage.completion_tokens <= 1024 // 4  # a quarter of the context


@pytest.mark.parametrize("stream", [False, True])
def test_past_its_trigger_a_conversation_is_compacted_then_answered(
    claude: anthropic.Anthropic, stream: bool
) -> None:
    system = f"You are agent {uuid.uuid4().hex}."
    conversation = _conversation()
    kwargs: Any = dict(model=MODEL, system=system, max_tokens=4, betas=BETAS)
    whole = claude.beta.messages.count_tokens(
        model=MODEL, system=system, messages=conversation
    ).input_tokens
    msg = anthropic_message(
        claude.beta.messages, stream, **kwargs, messages=conversation, context_management=_edit(100)
    )
    assert msg.content[0].type == "compaction" and msg.stop_reason != "compaction", msg
    assert all(b.type != "compaction" for b in msg.content[1:])
    read = prompt_tokens(msg)
    assert whole > 100 and read < whole - 100, (whole, msg.usage)
    # sent back first, the compaction stands in for what it summarizes: the next turn reads
    # the compacted conversation and the answer from the cache
    back: Any = [b.model_dump(exclude_none=True) for b in msg.content]
    turn: Any = [{"role": "assistant", "content": back}, {"role": "user", "content": "Go on."}]
    after = claude.beta.messages.create(**kwargs, messages=turn)
    assert after.content[:1] == [] or after.content[0].type != "compaction"
    assert (after.usage.cache_read_input_tokens or 0) >= read - 3, (msg.usage, after.usage)
    told: Any = [summary.told(msg.content[0].content), {"role": "user", "content": "Go on."}]  # type: ignore[union-attr]
    counted = claude.beta.messages.count_tokens(model=MODEL, system=system, messages=turn)
    # the compaction renders as the user message that gives its summary, then the answer
    answer = [b for b in back[1:] if b["type"] == "text"]
    if not answer:  # no text came: the answer renders as an empty assistant turn
        return
    told.insert(1, {"role": "assistant", "content": answer})
    assert (
        counted.input_tokens
        == claude.beta.messages.count_tokens(model=MODEL, system=system, messages=told).input_tokens
    )


def test_a_compaction_that_pauses_and_bad_triggers(claude: anthropic.Anthropic) -> None:
    kwargs: Any = dict(model=MODEL, max_tokens=4, betas=BETAS, messages=_conversation())
    paused = claude.beta.messages.create(**kwargs, context_management=_edit(100, pause=True))
    assert paused.stop_reason == "compaction" and [b.type for b in paused.content] == ["compaction"]
    under = claude.beta.messages.create(**kwargs, context_management=_edit(100_000))
    assert all(b.type != "compaction" for b in under.content)
    with pytest.raises(anthropic.BadRequestError, match="trigger"):
        claude.beta.messages.create(**kwargs, context_management=_edit(0))
    with pytest.raises(anthropic.BadRequestError, match="compaction"):
        claude.beta.messages.create(**kwargs, extra_body={"compaction": {"type": "enabled"}})


def test_a_conversation_past_the_context_compacts(claude: anthropic.Anthropic) -> None:
    """A conversation past the tiny model's context (a 400 as a message) compacts: the
    summary reads the task and the latest turns that leave it room (``api/turns.py``)."""
    result: Any = {"type": "tool_result", "tool_use_id": "t2", "content": RESULT}
    again: Any = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t2", "name": "ls", "input": {}}],
        },
        {"role": "user", "content": [result]},
        {"role": "user", "content": "And now?"},
    ]
    long = [*_conversation(), *again]
    kwargs: Any = dict(model=MODEL, messages=long, max_tokens=4, betas=BETAS)
    with pytest.raises(anthropic.BadRequestError, match="context"):
        claude.beta.messages.create(**kwargs)
    msg = claude.beta.messages.create(**kwargs, compaction={"type": "summarize"})
    assert msg.stop_reason == "compaction"
    read = prompt_tokens(msg)
    assert 0 < read <= 1024 - 1024 // 4
    answered = claude.beta.messages.create(**kwargs, context_management=_edit(500))
    assert answered.content[0].type == "compaction" and answered.stop_reason != "compaction"
