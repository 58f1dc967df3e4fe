"""What OpenAI's and Anthropic's clients read beside a response, through the official clients,
unchanged, against a real server (``compat_server``): a stored response's input items (the
chain's, newest first, in pages); the input-token count of a response not yet made (equal to
the usage of the same body's response); a turn's calls given as separate items rendered as the
one turn; one model's card (``models.retrieve`` of both clients, Anthropic's ``models.list``);
the body SGLang's gateways forward."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import anthropic
import httpx
import openai
import pytest
from keyed_harness import A, B, KeyedServer
from serving_harness import Server
from test_server_tools import MODEL, WEATHER

pytestmark = pytest.mark.timeout(180)
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]


def _instructions() -> str:
    return f"You are agent {uuid.uuid4().hex}."  # a prompt of its own: no other test's cache


def test_the_input_items_of_a_chain_newest_first_in_pages(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model=MODEL, instructions=_instructions(), input="Say something.", max_output_tokens=3
    )
    given: Any = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "More."}]},
        {"type": "message", "role": "user", "content": "And then?", "id": "msg_given"},
    ]
    second = oai.responses.create(
        model=MODEL, previous_response_id=first.id, input=given, max_output_tokens=3
    )
    listed = oai.responses.input_items.list(second.id)
    # OpenAI's default order: the newest first; the first response's output sits between inputs
    expected = [
        ("message", "user", "And then?"),
        ("message", "user", "More."),
        *[(item.type, "assistant", item.content[0].text) for item in reversed(first.output)],
        ("message", "user", "Say something."),
    ]
    seen = [(item.type, item.role, item.content[0].text) for item in listed.data]
    assert seen == expected and listed.has_more is False
    assert listed.data[0].id == "msg_given"  # the client's id kept
    assert listed.data[-2].id == first.output[-1].id
    ids = [item.id for item in listed.data]
    assert len(set(ids)) == len(ids)
    ascending = oai.responses.input_items.list(second.id, order="asc")
    assert [item.id for item in ascending.data] == ids[::-1]
    # one item a page: the client follows ``after`` through the pages to the same ids, and the
    # ids a page names are stable from call to call
    assert [item.id for item in oai.responses.input_items.list(second.id, limit=1)] == ids
    one = oai.responses.input_items.list(second.id, limit=1, after=ids[0])
    assert [item.id for item in one.data] == [ids[1]] and one.has_more is True
    with pytest.raises(openai.NotFoundError):
        oai.responses.input_items.list(second.id, after="msg_none")
    with pytest.raises(openai.BadRequestError):
        oai.responses.input_items.list(second.id, limit=0)
    oai.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.input_items.list(second.id)


def test_a_function_calls_items(oai: openai.OpenAI) -> None:
    call: Any = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
    }
    output: Any = {"type": "function_call_output", "call_id": "call_1", "output": "rain"}
    resp = oai.responses.create(
        model=MODEL,
        instructions=_instructions(),
        input=[{"role": "user", "content": "Weather in Oslo?"}, call, output],
        tools=TOOLS,
        max_output_tokens=2,
    )
    items = oai.responses.input_items.list(resp.id, order="asc").data
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]
    assert (items[1].call_id, items[1].name, items[1].arguments) == (
        "call_1",
        "get_weather",
        call["arguments"],
    )
    assert (items[2].call_id, items[2].output, items[2].status) == ("call_1", "rain", "completed")


def test_the_input_token_count_is_the_responses_usage(oai: openai.OpenAI) -> None:
    body: Any = dict(model=MODEL, instructions=_instructions(), tools=TOOLS)
    counted = oai.responses.input_tokens.count(**body, input="Weather in Rome?")
    first = oai.responses.create(**body, input="Weather in Rome?", max_output_tokens=2)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == first.usage.input_tokens
    # chained: the stored conversation is counted too, as the chained response renders it
    chained = dict(body, previous_response_id=first.id, input="And in Bern?")
    counted = oai.responses.input_tokens.count(**chained)
    assert (
        counted.input_tokens
        == oai.responses.create(**chained, max_output_tokens=1).usage.input_tokens
    )
    assert counted.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        oai.responses.input_tokens.count(model="no-such-model", input="hi")
    with pytest.raises(openai.NotFoundError):
        oai.responses.input_tokens.count(model=MODEL, input="hi", previous_response_id="resp_none")
    unsupported: Any = [{"type": "computer_call_output"}]
    with pytest.raises(openai.BadRequestError, match="not supported"):
        oai.responses.input_tokens.count(model=MODEL, input=unsupported)


def test_a_tenants_input_items_are_its_own(keyed_server: KeyedServer) -> None:
    mine = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=A, max_retries=0)
    theirs = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=B, max_retries=0)
    model = mine.models.list().data[0].id
    resp = mine.responses.create(model=model, input="hi", max_output_tokens=1)
    assert [item.type for item in mine.responses.input_items.list(resp.id)] == ["message"]
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(resp.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_tokens.count(model=model, input="hi", previous_response_id=resp.id)


def test_one_models_card_for_both_clients(oai: openai.OpenAI, compat_server: Server) -> None:
    served = oai.models.list().data[0]  # its id the served name, which MODEL is an alias of
    card = oai.models.retrieve(MODEL)
    assert card.model_dump() == served.model_dump() and card.object == "model"
    assert oai.models.retrieve(served.id).model_dump() == served.model_dump()
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")
    claude = anthropic.Anthropic(base_url=compat_server.url, api_key="unused", max_retries=0)
    models = claude.models.list()
    assert [m.id for m in models.data] == [served.id] and models.has_more is False
    info = claude.models.retrieve(MODEL)
    assert (info.id, info.display_name, info.type) == (served.id, served.id, "model")
    assert info.created_at == datetime.datetime.fromtimestamp(card.created, datetime.timezone.utc)
    assert info.max_input_tokens == card.model_dump()["max_model_len"]
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("no-such-model")


def test_parallel_calls_given_as_items_render_as_one_turn(
    oai: openai.OpenAI, http: httpx.Client
) -> None:
    """An agent re-sends a turn's two calls as two items: they render as the one assistant
    turn the model wrote (the chat route's rendering of it, through ``/tokenize``), not as two
    turns, so the re-sent prompt's prefix is what the cache holds."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in (1, 2)
    ]
    items: Any = [
        {"role": "user", "content": "Two calls."},
        *[
            {"type": "function_call", "call_id": c["id"], "name": "f", "arguments": "{}"}
            for c in calls
        ],
        *[{"type": "function_call_output", "call_id": c["id"], "output": "ok"} for c in calls],
    ]
    user = [{"role": "user", "content": "Two calls."}]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    one_turn = [*user, {"role": "assistant", "content": None, "tool_calls": calls}, *results]
    two_turns = [
        *user,
        *[{"role": "assistant", "content": None, "tool_calls": [c]} for c in calls],
        *results,
    ]

    def rendered(messages: list[Any]) -> int:
        resp = http.post("/tokenize", json={"model": MODEL, "messages": messages})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["count"])

    counted = oai.responses.input_tokens.count(model=MODEL, input=items).input_tokens
    assert counted == rendered(one_turn) != rendered(two_turns)


def test_what_sglangs_gateways_add_is_taken(http: httpx.Client) -> None:
    """smg and sglang-router forward a Responses body with SGLang's sampling fields at their
    defaults and explicit nulls (docs/data_parallel.md): the same response as without them."""
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "temperature": 0}
    added = {"stream": None, "store": None, "parallel_tool_calls": None, "top_k": -1}
    added |= {"min_p": 0.0, "repetition_penalty": 1.0, "priority": 0}
    plain, routed = (http.post("/v1/responses", json=b) for b in (body, {**body, **added}))
    assert plain.status_code == routed.status_code == 200, routed.text
    assert routed.json()["store"] is True and routed.json()["parallel_tool_calls"] is True
    said = [[item["content"] for item in r.json()["output"]] for r in (plain, routed)]
    assert said[0] == said[1]
