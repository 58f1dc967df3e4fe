"""Anthropic's threads (``thread``) through the official ``anthropic`` client: a thread created
by one message goes on with only each turn's new messages, streamed or not, a tool loop's
calls included. The oracle is the same door given the whole conversation: the same prompt
tokens, and the held turns read from the radix cache. Another tenant's thread, or an unknown
one, is a 404 in Anthropic's shape."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import pytest
from keyed_harness import A, B, KeyedServer
from serving_harness import anthropic_message, prompt_tokens
from test_server_tools import MODEL

pytestmark = pytest.mark.timeout(180)

# strict, of no parameters: a forced call is written whole in a few tokens
NOTHING = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS: Any = [{"name": "ls", "input_schema": NOTHING, "strict": True}]
GREEDY: Any = {"temperature": 0}


def _whole(claude: anthropic.Anthropic, system: str, messages: Any) -> int:
    counted = claude.messages.count_tokens(
        model=MODEL, system=system, tools=TOOLS, messages=messages
    )
    return counted.input_tokens


def test_a_thread_goes_on_with_each_turns_new_messages_alone(claude: anthropic.Anthropic) -> None:
    system = f"You are agent {uuid.uuid4().hex}."
    kwargs: Any = dict(model=MODEL, system=system, tools=TOOLS, extra_body=GREEDY)
    task: Any = {"role": "user", "content": "List the files."}
    first = claude.beta.messages.create(
        **kwargs, messages=[task], max_tokens=32,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thread={"type": "create"},
    )  # fmt: skip
    assert first.stop_reason == "tool_use", first.content
    call = next(b for b in first.content if b.type == "tool_use")
    answer: Any = {"role": "assistant", "content": [b.model_dump() for b in first.content]}
    result: Any = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.py b.py"}],
    }
    # only the tool's result: the held task and call render before it, as the client's would
    second = claude.beta.messages.create(
        **kwargs, messages=[result], max_tokens=4,
        thread={"type": "continue", "previous_message_id": first.id},
    )  # fmt: skip
    whole = _whole(claude, system, [task, answer, result])
    assert prompt_tokens(second) == whole
    assert (second.usage.cache_read_input_tokens or 0) >= prompt_tokens(first), second.usage
    # streamed, then continued from the streamed answer
    again: Any = {"role": "user", "content": "And the largest?"}
    third = anthropic_message(
        claude.beta.messages, True, **kwargs, messages=[{"role": "user", "content": "Thanks."}],
        max_tokens=4, thread={"type": "continue", "previous_message_id": second.id},
    )  # fmt: skip
    fourth = claude.beta.messages.create(
        **kwargs, messages=[again], max_tokens=2,
        thread={"type": "continue", "previous_message_id": third.id},
    )  # fmt: skip
    said = [{"role": "assistant", "content": [b.model_dump() for b in m.content]}
            for m in (second, third)]  # fmt: skip
    thanks: Any = {"role": "user", "content": "Thanks."}
    conversation = [task, answer, result, said[0], thanks, said[1], again]
    assert prompt_tokens(fourth) == _whole(claude, system, conversation)
    # a message sent without a thread is not held; the held turns are left as they were
    plain = claude.beta.messages.create(**kwargs, messages=[task], max_tokens=1)
    for unheld in (plain.id, f"msg_{uuid.uuid4().hex[:24]}"):
        with pytest.raises(anthropic.NotFoundError, match="no message") as err:
            claude.beta.messages.create(
                **kwargs, messages=[again], max_tokens=1,
                thread={"type": "continue", "previous_message_id": unheld},
            )  # fmt: skip
        assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    again_second = claude.beta.messages.create(
        **kwargs, messages=[result], max_tokens=1,
        thread={"type": "continue", "previous_message_id": first.id},
    )  # fmt: skip
    assert prompt_tokens(again_second) == whole
    with pytest.raises(anthropic.BadRequestError, match="previous_message_id"):
        claude.beta.messages.create(
            **kwargs, messages=[again], max_tokens=1, thread={"type": "continue"}
        )


def test_a_thread_is_its_tenants_own(keyed_server: KeyedServer) -> None:
    def client(key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=keyed_server.url, api_key=key, max_retries=0)

    model = client(A).models.list().data[0].id
    kwargs: Any = dict(model=model, max_tokens=1)
    ask: Any = [{"role": "user", "content": f"Hi, agent {uuid.uuid4().hex}."}]
    held = client(A).beta.messages.create(**kwargs, messages=ask, thread={"type": "create"})
    going_on: Any = {"type": "continue", "previous_message_id": held.id}
    assert client(A).beta.messages.create(**kwargs, messages=ask, thread=going_on).id
    with pytest.raises(anthropic.NotFoundError, match="no message"):
        client(B).beta.messages.create(**kwargs, messages=ask, thread=going_on)
