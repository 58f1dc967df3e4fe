"""``POST /v1/responses/compact`` through the official ``openai`` client: a conversation becomes
its user messages and one ``compaction`` item, whose summary is what the model writes when asked
for one after the conversation (the oracle: the chat route given the same messages), and which
later requests send in place of the rest, rendered as a user message giving the summary."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest
from test_server_tools import MODEL

from radixserve.api import summary
from radixserve.api.responses import compaction

pytestmark = pytest.mark.timeout(180)

RESULT = "file-" * 250  # a long tool result: the compacted conversation is shorter
GREEDY: Any = {"temperature": 0, "max_output_tokens": 12}


def _conversation(system: str) -> list[Any]:
    return [
        {"role": "user", "content": f"Look at the files. {system}"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": RESULT},
        {"role": "assistant", "content": "There are many files."},
        {"role": "user", "content": "Which is largest?"},
    ]


def _summary(compacted: Any) -> str:
    (item,) = [i for i in compacted.output if i.type == "compaction"]
    return compaction.summary_of(item.model_dump())


def test_a_conversation_compacts_to_its_user_messages_and_the_models_summary(
    oai: openai.OpenAI,
) -> None:
    system = f"You are agent {uuid.uuid4().hex}."
    conversation = _conversation(system)
    # the oracle: the chat route asked for the summary after the same conversation
    messages: Any = [
        {"role": "system", "content": system},
        {"role": "user", "content": conversation[0]["content"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": RESULT},
        {"role": "assistant", "content": "There are many files."},
        {"role": "user", "content": "Which is largest?"},
        {"role": "user", "content": summary.PROMPT},
    ]
    # the summary's prompt cached first, so both compared below reuse it: a cold prefill and
    # a prefix hit round differently, and a random model's greedy pick can flip at a near tie
    oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=1)
    compacted = oai.responses.compact(
        model=MODEL, instructions=system, input=conversation, extra_body=GREEDY
    )
    assert compacted.object == "response.compaction"
    kinds = [(i.type, getattr(i, "role", None)) for i in compacted.output]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)], kinds
    users = [i.content[0].text for i in compacted.output[:2]]  # type: ignore[union-attr]
    assert users == [conversation[0]["content"], conversation[-1]["content"]]
    chat = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=12)
    assert compacted.usage.output_tokens > 0
    assert _summary(compacted) == (chat.choices[0].message.content or "")
    assert compacted.usage.input_tokens == chat.usage.prompt_tokens
    assert compacted.usage.output_tokens == chat.usage.completion_tokens


def test_the_compacted_conversation_goes_on_shorter(oai: openai.OpenAI) -> None:
    system = f"You are agent {uuid.uuid4().hex}."
    conversation = _conversation(system)
    compacted = oai.responses.compact(
        model=MODEL, instructions=system, input=conversation, extra_body=GREEDY
    )
    after: Any = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    after.append({"role": "user", "content": "Go on."})
    following = oai.responses.create(
        model=MODEL, instructions=system, input=after, max_output_tokens=2
    )
    whole = [*conversation, {"role": "user", "content": "Go on."}]
    count = oai.responses.input_tokens.count
    full = count(model=MODEL, instructions=system, input=whole).input_tokens
    assert following.usage.input_tokens < full - 100  # the long tool result is gone
    # the compaction item renders as a user message that gives its summary
    told = [*after[:2], {"role": "user", "content": summary.PREFACE + _summary(compacted)}]
    told.append(after[-1])
    assert count(model=MODEL, instructions=system, input=told).input_tokens == (
        following.usage.input_tokens
    )


def test_a_chained_response_compacts_with_its_chain(oai: openai.OpenAI) -> None:
    system = f"You are agent {uuid.uuid4().hex}."
    first = oai.responses.create(
        model=MODEL, instructions=system, input="Hello there.", max_output_tokens=3
    )
    compacted = oai.responses.compact(
        model=MODEL,
        instructions=system,
        previous_response_id=first.id,
        input="And then?",
    )
    texts = [i.content[0].text for i in compacted.output if i.type == "message"]  # type: ignore[union-attr]
    assert texts == ["Hello there.", "And then?"]
    assert compacted.output[-1].type == "compaction"
    # no max_output_tokens: a quarter of the tiny model's context at most
    assert compacted.usage.output_tokens <= 1024 // 4


def test_a_compaction_made_elsewhere_is_a_400(oai: openai.OpenAI) -> None:
    foreign: Any = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABo-x"}
    with pytest.raises(openai.BadRequestError, match="not made here"):
        oai.responses.create(model=MODEL, input=[foreign], max_output_tokens=1)
    with pytest.raises(openai.BadRequestError, match="stream"):
        oai.responses.compact(model=MODEL, input="hi", extra_body={"stream": True})


@pytest.mark.parametrize("stream", [False, True])
def test_a_create_past_its_threshold_compacts_first(oai: openai.OpenAI, stream: bool) -> None:
    """``context_management``: past ``compact_threshold`` tokens the conversation is compacted
    before the answer (the output's first item), the answer reads the compacted one, and a
    turn chained to it goes on from the compacted conversation, a cache hit."""
    system = f"You are agent {uuid.uuid4().hex}."
    conversation = _conversation(system)
    kwargs: Any = dict(model=MODEL, instructions=system, max_output_tokens=4)
    managed: Any = [{"type": "compaction", "compact_threshold": 100}]
    if stream:
        with oai.responses.stream(
            **kwargs, input=conversation, context_management=managed
        ) as events:
            seen = list(events)
        first = seen[-1].response  # type: ignore[union-attr]
        added = [e.item.type for e in seen if e.type == "response.output_item.added"]
        assert added[0] == "compaction", added
    else:
        first = oai.responses.create(**kwargs, input=conversation, context_management=managed)
    assert first.output[0].type == "compaction", first.output
    assert all(item.type != "compaction" for item in first.output[1:])
    count = oai.responses.input_tokens.count
    whole = count(model=MODEL, instructions=system, input=conversation).input_tokens
    assert whole > 100 and first.usage.input_tokens < whole - 100
    (item,) = [i.model_dump() for i in first.output if i.type == "compaction"]
    told = [*compaction.user_messages(conversation), compaction.message(item)]
    assert count(model=MODEL, instructions=system, input=told).input_tokens == (
        first.usage.input_tokens
    )
    # chained (under its threshold now): the compacted conversation, then the answer
    second = oai.responses.create(**kwargs, previous_response_id=first.id, input="Go on.")
    assert second.output[0].type != "compaction"
    assert second.usage.input_tokens < whole
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens - 3, (first.usage, second.usage)


def test_under_its_threshold_a_create_is_not_compacted(oai: openai.OpenAI) -> None:
    managed: Any = [{"type": "compaction", "compact_threshold": 100_000}]
    response = oai.responses.create(
        model=MODEL, input="Hello.", max_output_tokens=2, context_management=managed
    )
    assert all(item.type != "compaction" for item in response.output)
    with pytest.raises(openai.BadRequestError, match="compaction"):
        oai.responses.create(
            model=MODEL, input="Hi.", max_output_tokens=1, context_management=[{"type": "x"}]
        )


def test_items_before_a_compaction_but_the_users_are_what_it_holds(oai: openai.OpenAI) -> None:
    """A client that keeps the items a compaction holds (not dropping them) gets the same
    prompt as one that drops them."""
    system = f"You are agent {uuid.uuid4().hex}."
    conversation = _conversation(system)
    compacted = oai.responses.compact(
        model=MODEL, instructions=system, input=conversation, extra_body=GREEDY
    )
    (item,) = [i.model_dump() for i in compacted.output if i.type == "compaction"]
    new: Any = {"role": "user", "content": "Go on."}
    kept = [*conversation, item, new]
    dropped = [*compaction.user_messages(conversation), item, new]
    count = oai.responses.input_tokens.count
    assert count(model=MODEL, instructions=system, input=kept).input_tokens == (
        count(model=MODEL, instructions=system, input=dropped).input_tokens
    )


def test_a_conversation_past_the_context_is_compacted_from_its_latest_turns(
    oai: openai.OpenAI,
) -> None:
    """What compaction is for: a conversation past the tiny model's 1,024-token context (a 400
    as a create) compacts, its summary reading the task and the latest turns that leave the
    summary room (``api/turns.py``); the compacted conversation then goes on."""
    system = f"You are agent {uuid.uuid4().hex}."
    again: Any = [
        {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": RESULT},
        {"role": "user", "content": "And now?"},
    ]
    long = [*_conversation(system), *again]
    with pytest.raises(openai.BadRequestError, match="context"):
        oai.responses.create(model=MODEL, instructions=system, input=long, max_output_tokens=1)
    compacted = oai.responses.compact(model=MODEL, instructions=system, input=long)
    room = 1024 // 4
    assert 0 < compacted.usage.input_tokens <= 1024 - room
    after: Any = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    going = oai.responses.create(model=MODEL, instructions=system, input=after, max_output_tokens=2)
    assert going.usage.input_tokens < 1024


def test_a_conversation_compacted_by_a_create_goes_on_from_its_compaction(
    oai: openai.OpenAI,
) -> None:
    """In a stored conversation the compaction item is added with the output: its next turn
    renders the user messages, the compaction and what followed it, not the items it holds."""
    system = f"You are agent {uuid.uuid4().hex}."
    conv = oai.conversations.create(items=_conversation(system))
    managed: Any = [{"type": "compaction", "compact_threshold": 100}]
    kwargs: Any = dict(model=MODEL, instructions=system, conversation=conv.id, max_output_tokens=3)
    first = oai.responses.create(**kwargs, input="Sum it up.", context_management=managed)
    assert first.output[0].type == "compaction"
    listed = oai.conversations.items.list(conv.id, order="asc", limit=100).data
    assert [i.type for i in listed].count("compaction") == 1
    second = oai.responses.create(**kwargs, input="Go on.")
    assert second.output[0].type != "compaction"
    assert second.usage.input_tokens < first.usage.input_tokens + 100  # the result is gone
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens - 3, (first.usage, second.usage)
