"""OpenAI's Conversations API through the official ``openai`` client, unchanged, against a real
server (``compat_server``): a conversation and its items made, listed in pages, read, changed
and deleted; responses given the conversation render its items first (the second turn's prompt
a radix hit) and add their input and output to it; one tenant's conversation a 404 to another.
The Agents SDK's conversation session is in ``test_agents_sdk.py``."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest
from keyed_harness import STORED_BYTES, A, B, KeyedServer
from serving_harness import final_response
from test_server_tools import MODEL

pytestmark = pytest.mark.timeout(180)
UNSUPPORTED: Any = [{"type": "computer_call_output"}]  # an item no chat renders


def _said(item: Any) -> tuple[str, str, str]:
    return (item.type, item.role, item.content[0].text)


def test_a_conversation_and_its_items(oai: openai.OpenAI) -> None:
    conv = oai.conversations.create(
        items=[{"role": "user", "content": "One."}, {"role": "user", "content": "Two."}],
        metadata={"topic": "counting"},
    )
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "counting"}
    assert oai.conversations.retrieve(conv.id).model_dump() == conv.model_dump()
    updated = oai.conversations.update(conv.id, metadata={"topic": "numbers"})
    assert updated.metadata == {"topic": "numbers"}
    added = oai.conversations.items.create(
        conv.id,
        items=[
            {"type": "message", "role": "assistant", "content": "Three."},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "4"},
        ],
    )
    assert [item.type for item in added.data] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    listed = oai.conversations.items.list(conv.id)  # newest first, as OpenAI's
    ids = [item.id for item in listed.data]
    assert ids == [item.id for item in added.data][::-1] + ids[3:] and len(ids) == 5
    assert [_said(item) for item in listed.data[3:]] == [
        ("message", "user", "Two."),
        ("message", "user", "One."),
    ]
    paged = oai.conversations.items.list(conv.id, order="asc", limit=2)
    assert [item.id for item in paged] == ids[::-1]  # the client follows ``after``
    assert oai.conversations.items.retrieve(ids[0], conversation_id=conv.id).type == (
        "function_call_output"
    )
    after = oai.conversations.items.delete(ids[0], conversation_id=conv.id)
    assert after.id == conv.id
    assert [item.id for item in oai.conversations.items.list(conv.id)] == ids[1:]
    with pytest.raises(openai.NotFoundError):
        oai.conversations.items.retrieve(ids[0], conversation_id=conv.id)
    deleted = oai.conversations.delete(conv.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (conv.id, True, "conversation.deleted")
    with pytest.raises(openai.NotFoundError):
        oai.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        oai.conversations.items.list(conv.id)


def test_what_a_conversation_refuses(oai: openai.OpenAI) -> None:
    conv = oai.conversations.create()
    with pytest.raises(openai.BadRequestError, match="not supported"):
        oai.conversations.items.create(conv.id, items=UNSUPPORTED)
    many: Any = [{"role": "user", "content": str(i)} for i in range(21)]
    with pytest.raises(openai.BadRequestError):
        oai.conversations.items.create(conv.id, items=many)
    with pytest.raises(openai.BadRequestError, match="metadata"):
        oai.conversations.create(metadata={str(i): "v" for i in range(17)})
    assert oai.conversations.items.list(conv.id).data == []  # nothing added by the refusals


def test_responses_in_a_conversation(oai: openai.OpenAI) -> None:
    system = f"You are agent {uuid.uuid4().hex}."  # a prompt of its own: no other test's cache
    conv = oai.conversations.create(items=[{"role": "system", "content": system}])
    first = oai.responses.create(
        model=MODEL, conversation=conv.id, input="Say something.", max_output_tokens=3
    )
    assert first.conversation is not None and first.conversation.id == conv.id
    kinds = [item.type for item in oai.conversations.items.list(conv.id, order="asc")]
    assert kinds == ["message", "message", *[item.type for item in first.output]]
    second = oai.responses.create(
        model=MODEL, conversation={"id": conv.id}, input="And again.", max_output_tokens=2
    )
    # the first turn's prompt and answer are rendered again (but for the last few tokens of
    # the prompt, which the answer's text, tokenized anew, may merge with)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 3
    listed = oai.responses.input_items.list(second.id, order="asc")
    assert [item.id for item in listed.data][:2] == [
        item.id for item in oai.conversations.items.list(conv.id, order="asc").data[:2]
    ]
    assert len(oai.conversations.items.list(conv.id, limit=100).data) == len(kinds) + 1 + len(
        second.output
    )
    counted = oai.responses.input_tokens.count(model=MODEL, conversation=conv.id, input="Hm.")
    assert counted.input_tokens > second.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="not both"):
        oai.responses.create(
            model=MODEL, conversation=conv.id, previous_response_id=first.id, input="x"
        )
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=MODEL, conversation="conv_none", input="x")


def test_a_tenants_conversations_are_its_own(keyed_server: KeyedServer) -> None:
    mine = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=A, max_retries=0)
    theirs = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=B, max_retries=0)
    model = mine.models.list().data[0].id
    conv = mine.conversations.create(items=[{"role": "user", "content": "mine"}])
    mine.responses.create(model=model, conversation=conv.id, input="hi", max_output_tokens=1)
    for attempt in (
        lambda: theirs.conversations.retrieve(conv.id),
        lambda: theirs.conversations.items.list(conv.id),
        lambda: theirs.conversations.items.create(
            conv.id, items=[{"role": "user", "content": "x"}]
        ),
        lambda: theirs.conversations.delete(conv.id),
        lambda: theirs.responses.create(model=model, conversation=conv.id, input="hi"),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert len(mine.conversations.items.list(conv.id).data) >= 3


def test_a_tenants_stored_bytes_are_bounded(keyed_server: KeyedServer) -> None:
    """A tenant stores at most ``--max-stored-bytes`` of conversations: one cannot grow past
    it, and more of them push out the tenant's oldest, never another tenant's; a response whose
    input alone is past the bound is a 400 unless it is not stored."""
    mine = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=A, max_retries=0)
    theirs = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=B, max_retries=0)
    model = mine.models.list().data[0].id
    third: Any = [{"role": "user", "content": "x" * (STORED_BYTES // 3)}]
    kept = theirs.conversations.create(items=[{"role": "user", "content": "theirs"}])
    big = mine.conversations.create(items=third)
    mine.conversations.items.create(big.id, items=third)
    with pytest.raises(openai.BadRequestError, match="bytes of items"):
        mine.conversations.items.create(big.id, items=third)
    with pytest.raises(openai.BadRequestError, match="bytes of items"):
        mine.responses.create(model=model, conversation=big.id, input=third)
    assert len(mine.conversations.items.list(big.id).data) == 2  # as it was
    newer = [mine.conversations.create(items=third) for _ in range(2)]
    with pytest.raises(openai.NotFoundError):  # the oldest went: its tenant's bytes were full
        mine.conversations.retrieve(big.id)
    assert [c.id for c in newer] == [mine.conversations.retrieve(c.id).id for c in newer]
    assert theirs.conversations.retrieve(kept.id).id == kept.id
    half: Any = [{"role": "user", "content": "x" * (STORED_BYTES // 2)}]
    with pytest.raises(openai.BadRequestError, match="store: false") as caught:
        mine.responses.create(model=model, input=half, max_output_tokens=1)
    assert caught.value.body["param"] == "store"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="context"):  # not stored: its tokens count
        mine.responses.create(model=model, input=half, max_output_tokens=1, store=False)
    for conversation in [*newer, kept]:
        (theirs if conversation is kept else mine).conversations.delete(conversation.id)


def test_a_streamed_response_adds_its_items_too(oai: openai.OpenAI) -> None:
    conv = oai.conversations.create(items=[{"role": "system", "content": uuid.uuid4().hex}])
    with oai.responses.stream(
        model=MODEL, conversation=conv.id, input="Say something.", max_output_tokens=3
    ) as stream:
        final = final_response(stream)
    listed = oai.conversations.items.list(conv.id, order="asc").data
    assert [item.id for item in listed[2:]] == [item.id for item in final.output]
    assert _said(listed[1]) == ("message", "user", "Say something.")
