"""OpenAI's ``truncation: auto`` on the Responses door. Against a stand-in for the chat pipeline
whose prompt is one token per character: which messages are kept (the instructions, the task,
the latest turns, a tool's result with its call) and that the fewest turns go. Then through the
official client against a real server (``compat_server``, a 1,024-token context): a
conversation too long for the context is a 400 as given and served with ``auto``, its prompt
counted alike by ``input_tokens``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from test_server_tools import MODEL

from radixserve.api.openai.protocol import ChatCompletionRequest
from radixserve.api.responses.protocol import ResponsesRequest
from radixserve.api.responses.truncation import chat_request

pytestmark = pytest.mark.timeout(180)


class _Chat:
    """What truncation uses of ``ChatServing``: the context, and a prompt of one token per
    character of its messages' text."""

    def __init__(self, context: int) -> None:
        self.tm = SimpleNamespace(info=SimpleNamespace(max_context_len=context))

    async def prompt_ids(self, request: ChatCompletionRequest, state: Any) -> list[int]:
        return [0] * sum(len(m.content or "") for m in request.messages)  # type: ignore[arg-type]


def _kept(context: int, items: list[dict[str, Any]], truncation: str = "auto") -> list[str]:
    body = ResponsesRequest.model_validate(
        {"instructions": "I", "input": items, "truncation": truncation, "max_output_tokens": 1}
    )
    chat = _Chat(context)
    request, ids = asyncio.run(chat_request(chat, body, [], None))  # type: ignore[arg-type]
    if truncation == "auto":  # the kept prompt's ids, rendered once: open takes them
        assert ids == asyncio.run(chat.prompt_ids(request, None))
    else:
        assert ids is None
    return [m.content or "" for m in request.messages]  # type: ignore[misc]


def _call(n: int) -> list[dict[str, Any]]:
    call = {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"}
    return [call, {"type": "function_call_output", "call_id": f"c{n}", "output": f"r{n}" * 5}]


def test_the_middle_goes_and_the_fewest_turns() -> None:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "D"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "a1" * 10},
        {"role": "user", "content": "u2" * 10},
        *_call(3),
        {"role": "user", "content": "last"},
    ]
    whole = ["I", "D", "task", "a1" * 10, "u2" * 10, "", "r3" * 5, "last"]
    assert _kept(61, items) == whole  # 60 characters and the output's 1: nothing goes
    assert _kept(60, items, truncation="disabled") == whole  # too long, but not asked
    # each context keeps the most latest turns that fit, the call and its result together,
    # the instructions and what comes up to the task always
    assert _kept(60, items) == ["I", "D", "task", "u2" * 10, "", "r3" * 5, "last"]
    assert _kept(40, items) == ["I", "D", "task", "", "r3" * 5, "last"]
    assert _kept(20, items) == ["I", "D", "task", "last"]
    assert _kept(10, items) == whole  # nothing fits: left whole, refused downstream by length


def test_a_conversation_past_the_context_goes_on_with_auto(oai: openai.OpenAI) -> None:
    turn = " ".join(f"note{i}" for i in range(60))  # each message well under the context
    items: Any = [{"role": "user", "content": "The task."}]
    for n in range(12):
        items += [{"role": "assistant", "content": turn}, {"role": "user", "content": f"{n}"}]
    body: Any = dict(model=MODEL, input=items, max_output_tokens=4)
    whole = oai.responses.input_tokens.count(model=MODEL, input=items).input_tokens
    assert whole > 1024, whole
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        oai.responses.create(**body)
    served = oai.responses.create(**body, truncation="auto")
    counted = oai.responses.input_tokens.count(model=MODEL, input=items, truncation="auto")
    assert served.usage.input_tokens == counted.input_tokens
    one_turn = oai.responses.input_tokens.count(model=MODEL, input=items[1:3]).input_tokens
    # the fewest turns went: one more kept would not leave the output its 4 tokens
    assert 1024 - 4 - one_turn < served.usage.input_tokens <= 1024 - 4
