"""The Responses API's logprobs (``include: ["message.output_text.logprobs"]``, ``top_logprobs``)
through the official ``openai`` client, against the chat route's logprobs of the same prompt as
the oracle: greedy, both answer with the same tokens, and each token's logprob and top
alternatives agree. Streamed, the deltas' logprobs add up to the done event's and the final
response's."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest
from test_server_tools import MODEL

pytestmark = pytest.mark.timeout(180)
INCLUDE: Any = ["message.output_text.logprobs"]
TOKENS = 8


def _pair(oai: openai.OpenAI, top: int) -> tuple[Any, Any]:
    """The same greedy prompt through the chat route and the Responses API, each a radix hit of
    the prompt (a cold prefill's numbers differ from a hit's in the last bits, and the random
    model's near ties could then pick another token)."""
    system, user = f"You are agent {uuid.uuid4().hex}.", "Say something."
    messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    kwargs: Any = dict(model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0)
    oai.chat.completions.create(**kwargs)  # the prompt cached
    chat = oai.chat.completions.create(**kwargs, logprobs=True, top_logprobs=top)
    response = oai.responses.create(
        model=MODEL,
        instructions=system,
        input=user,
        max_output_tokens=TOKENS,
        temperature=0,
        include=INCLUDE,
        top_logprobs=top,
    )
    return chat, response


def _close(ours: list[Any], oracle: list[Any]) -> None:
    assert [t.token for t in ours] == [t.token for t in oracle]
    for mine, theirs in zip(ours, oracle, strict=True):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert mine.bytes == theirs.bytes
        assert [t.token for t in mine.top_logprobs] == [t.token for t in theirs.top_logprobs]
        for a, b in zip(mine.top_logprobs, theirs.top_logprobs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_logprobs_are_the_chat_routes(oai: openai.OpenAI) -> None:
    chat, response = _pair(oai, top=3)
    oracle = chat.choices[0].logprobs.content
    assert len(oracle) == chat.usage.completion_tokens > 0
    assert (
        response.usage.input_tokens_details.cached_tokens
        == chat.usage.prompt_tokens_details.cached_tokens
    )
    text = response.output[0].content[0]
    assert text.text == chat.choices[0].message.content
    assert response.top_logprobs == 3
    assert all(len(t.top_logprobs) == 3 for t in text.logprobs)
    _close(text.logprobs, oracle)
    # the greedy token is the likeliest (the first alternative, or tied with it: a random
    # model's near ties may order two alike)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in text.logprobs)


def test_no_logprobs_unless_asked(oai: openai.OpenAI) -> None:
    plain = oai.responses.create(model=MODEL, input="Hello.", max_output_tokens=3)
    assert plain.output[0].content[0].logprobs == []
    # top_logprobs alone asks for them too, with that many alternatives
    alone = oai.responses.create(model=MODEL, input="Hello.", max_output_tokens=3, top_logprobs=1)
    tokens = alone.output[0].content[0].logprobs
    assert len(tokens) == alone.usage.output_tokens
    assert all(len(t.top_logprobs) == 1 for t in tokens)
    # include alone: each token's own logprob, no alternatives
    bare = oai.responses.create(model=MODEL, input="Hello.", max_output_tokens=3, include=INCLUDE)
    tokens = bare.output[0].content[0].logprobs
    assert tokens and all(t.top_logprobs == [] and t.logprob <= 0 for t in tokens)


@pytest.mark.parametrize("regex", [None, "(x|xy|xyz)"], ids=["cut", "ended"])
def test_streamed_logprobs_add_up(oai: openai.OpenAI, regex: str | None) -> None:
    """The deltas' logprobs are the done event's and the whole response's, also where the
    output ends on a token of no text (an end of turn sampled in a step of its own)."""
    system = f"You are agent {uuid.uuid4().hex}."
    kwargs: Any = dict(model=MODEL, instructions=system, input="Say something.")
    kwargs |= dict(max_output_tokens=TOKENS, temperature=0, include=INCLUDE, top_logprobs=2)
    if regex is not None:
        kwargs["extra_body"] = {"regex": regex}
    oai.responses.create(**kwargs)  # the prompt cached: the next two are hits alike
    whole = oai.responses.create(**kwargs).output[0].content[0].logprobs
    deltas: list[Any] = []
    done: list[Any] = []
    with oai.responses.stream(**kwargs) as events:
        for event in events:
            if event.type == "response.output_text.delta":
                deltas += event.logprobs
            elif event.type == "response.output_text.done":
                done = event.logprobs
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert [t.token for t in deltas] == [t.token for t in done] == [t.token for t in whole]
    assert [t.logprob for t in done] == pytest.approx([t.logprob for t in whole], abs=1e-4)
    kept = final.output[0].content[0].logprobs
    assert [(t.token, t.logprob) for t in kept] == [(t.token, t.logprob) for t in done]


@pytest.mark.parametrize("top", [-1, 21])
def test_top_logprobs_out_of_range_is_a_400(oai: openai.OpenAI, top: int) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=MODEL, input="Hi.", include=INCLUDE, top_logprobs=top)
    assert "top_logprobs" in str(caught.value)
