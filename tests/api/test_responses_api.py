"""OpenAI's Responses API through the official ``openai`` client, unchanged, against a real
server (``compat_server``: a template that renders tools): text, a forced function call and a
chained ``previous_response_id`` turn whose prompt is a cache hit, streaming, a JSON schema,
the stored response's GET and DELETE, one tenant's id a 404 to another, tools as Codex sends
them (a namespace, a hosted web search), the client's ``parse`` helper."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import jsonschema
import openai
import pytest
from keyed_harness import A, B, KeyedServer
from test_server_tools import MODEL, WEATHER

pytestmark = pytest.mark.timeout(180)
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]


def _instructions() -> str:
    return f"You are agent {uuid.uuid4().hex}."  # a prompt of its own: no other test's cache


def _cut_at(response: Any, limit: int) -> None:
    """``response`` stopped at ``limit`` output tokens (incomplete, and its message too), or,
    where the random model ended on its EOS within them, complete."""
    tokens = response.usage.output_tokens
    assert (response.status, tokens) == ("incomplete", limit) or (
        response.status == "completed" and tokens <= limit
    ), (response.status, tokens)
    messages = [item for item in response.output if item.type == "message"]
    assert all(m.status == response.status for m in messages), response.output  # as OpenAI's


def test_text_then_a_chained_turn_hits_the_cache(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model=MODEL, instructions=_instructions(), input="Say something.", max_output_tokens=6
    )
    assert first.output[0].type == "message" and first.output_text
    _cut_at(first, 6)
    chained = oai.responses.create(
        model=MODEL,
        instructions=first.instructions,
        previous_response_id=first.id,
        input="And again.",
        max_output_tokens=2,
    )
    assert chained.previous_response_id == first.id
    # the first turn's prompt and answer are rendered again: a radix hit (but for the last few
    # tokens of the prompt, which the answer's text, tokenized anew, may merge with)
    assert chained.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 3
    assert oai.responses.retrieve(first.id).id == first.id
    oai.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)


def test_a_function_call_and_its_output(oai: openai.OpenAI) -> None:
    kwargs: Any = dict(model=MODEL, instructions=_instructions(), tools=TOOLS)
    # sampled at temperature 1: one call at most, so the output's length has a bound (parallel
    # calls let a random model go on adding them up to max_output_tokens)
    first = oai.responses.create(
        **kwargs,
        input="Weather in Paris?",
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=128,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1, first
    call = calls[0]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = oai.responses.create(
        **kwargs, previous_response_id=first.id, input=[output], max_output_tokens=4
    )
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 3


def test_streamed_events_in_order(oai: openai.OpenAI) -> None:
    # greedy: what the random model says is then the same at every run (sampled, a run of the
    # whole suite once got an answer without text, which this test cannot tell from a fault)
    with oai.responses.stream(
        model=MODEL,
        instructions="You are the agent of the streamed events' test.",  # this test's own prompt
        input="Say something.",
        max_output_tokens=8,
        temperature=0,
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    final = events[-1].response  # type: ignore[union-attr]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{final.status}"  # response.incomplete when cut, as OpenAI's
    _cut_at(final, 8)
    seen = (kinds, final.status, final.usage.output_tokens, final.model_dump()["output"])
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds, seen
    assert final.output_text and oai.responses.retrieve(final.id).output_text == final.output_text


def test_a_json_schema_format(oai: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    resp = oai.responses.create(
        model=MODEL,
        instructions=_instructions(),
        input="Weather as JSON.",
        text={"format": fmt},
        max_output_tokens=128,
    )
    jsonschema.validate(json.loads(resp.output_text), WEATHER)


def test_a_tenants_responses_are_its_own(keyed_server: KeyedServer) -> None:
    mine = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=A, max_retries=0)
    theirs = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=B, max_retries=0)
    model = mine.models.list().data[0].id
    resp = mine.responses.create(model=model, input="hi", max_output_tokens=2)
    assert mine.responses.retrieve(resp.id).id == resp.id
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(
            model=model, input="hi", previous_response_id=resp.id, max_output_tokens=2
        )


def test_a_streamed_function_call(oai: openai.OpenAI) -> None:
    with oai.responses.stream(
        model=MODEL,
        instructions=_instructions(),
        input="Weather in Lima?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,  # a bound on the output's length, as above
        max_output_tokens=128,
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    final = events[-1].response  # type: ignore[union-attr]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1, final
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_namespaced_and_hosted_tools_as_codex_sends_them(oai: openai.OpenAI) -> None:
    """Codex groups functions in a ``namespace`` and lists a hosted web search: the model is
    offered the namespace's functions (a call names its namespace, as OpenAI's do) and not the
    hosted tool (this server runs none); a tool the client would have to run as a built-in
    (``local_shell``) is a 400 naming it."""
    weather: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    tools: Any = [
        {"type": "namespace", "name": "forecasts", "description": "weather", "tools": [weather]},
        {"type": "web_search", "external_web_access": False},
    ]
    resp = oai.responses.create(
        model=MODEL,
        instructions=_instructions(),
        input="Weather in Paris?",
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=128,
        extra_body={"client_metadata": {"turn_id": "t1"}},  # Codex's
    )
    calls = [item for item in resp.output if item.type == "function_call"]
    assert len(calls) == 1, resp
    assert (calls[0].name, calls[0].namespace) == ("get_weather", "forecasts")
    with pytest.raises(openai.BadRequestError, match="local_shell"):
        oai.responses.create(model=MODEL, input="ls", tools=[{"type": "local_shell"}])


def test_the_clients_parse_helper(oai: openai.OpenAI) -> None:
    """``responses.parse(text_format=Model)``: the client's strict JSON schema of the model
    through the grammar, parsed back into it."""
    from pydantic import BaseModel

    class Forecast(BaseModel):
        city: Literal["Paris", "Oslo"]
        sunny: bool

    parsed = oai.responses.parse(
        model=MODEL,
        instructions=_instructions(),
        input="Forecast for Oslo.",
        text_format=Forecast,
        max_output_tokens=64,
    )
    assert isinstance(parsed.output_parsed, Forecast), parsed
