"""OpenAI's Agents SDK (``openai-agents``), unchanged, running agents against a real server
through the Responses API: a required tool choice makes the random model call the tool, the
SDK runs it and ends on its output (``parallel_tool_calls=False`` reaches the grammar: at most
one call, so the sampled call is one whole JSON object); the SDK's session memory re-sending
the whole conversation (a radix hit); a streamed run; ``output_type`` through the JSON-schema
grammar; a run chained by ``previous_response_id``."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from serving_harness import Server, serving
from test_server_tools import MODEL

pytestmark = pytest.mark.timeout(180)
agents = pytest.importorskip("agents", reason="needs openai-agents (the test extra)")


def _agent(compat_server: Server, chat: bool = False, model: str = MODEL, **kwargs: Any) -> Any:
    """An agent of its own prompt on the server through the Responses API (``chat``: the
    chat route, the SDK's other model)."""
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no export to OpenAI's service
    client = AsyncOpenAI(base_url=f"{compat_server.url}/v1", api_key="unused", max_retries=0)
    settings = kwargs.pop("model_settings", agents.ModelSettings(max_tokens=8))
    kind = agents.OpenAIChatCompletionsModel if chat else agents.OpenAIResponsesModel
    return agents.Agent(
        name="agent",
        instructions=f"You are agent {uuid.uuid4().hex}.",  # a prompt of its own
        model=kind(model=model, openai_client=client),
        model_settings=settings,
        **kwargs,
    )


def _forecaster(
    compat_server: Server, cities: list[str], chat: bool = False, model: str = MODEL, **more: Any
) -> Any:
    """An agent that must call its weather tool (``cities`` records each call) and ends on
    the tool's output. Sampled at temperature 1: one call at most, so the output's length has
    a bound (a random model's text would run to ``max_tokens``, an incomplete response the SDK
    raises)."""

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather of a city."""
        cities.append(city)
        return "sunny"

    settings = agents.ModelSettings(
        tool_choice="required", parallel_tool_calls=False, max_tokens=256, **more
    )
    return _agent(
        compat_server,
        chat,
        model,
        tools=[get_weather],
        model_settings=settings,
        tool_use_behavior="stop_on_first_tool",
    )


def test_an_agent_calls_its_function_tool(compat_server: Server) -> None:
    cities: list[str] = []
    agent = _forecaster(compat_server, cities)
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?"))
    assert len(cities) == 1 and cities[0] in {"Paris", "Oslo"}
    assert result.final_output == "sunny"


@pytest.mark.parametrize("chat", [False, True], ids=["responses", "chat"])
def test_the_settings_agents_set_on_either_model(compat_server: Server, chat: bool) -> None:
    """The settings an agent commonly sets (a reasoning effort, verbosity, metadata, no
    storing, usage) are taken through either of the SDK's models, run and streamed."""
    from openai.types.shared import Reasoning

    cities: list[str] = []
    settings: Any = dict(
        reasoning=Reasoning(effort="low"),
        verbosity="low",
        metadata={"team": "a"},
        store=False,
        include_usage=True,
        temperature=0.7,
        top_p=0.9,
    )
    agent = _forecaster(compat_server, cities, chat, **settings)

    async def run_and_stream() -> tuple[Any, Any]:
        ran = await agents.Runner.run(agent, "Weather in Oslo?")
        streamed = agents.Runner.run_streamed(agent, "Weather in Paris?")
        async for _ in streamed.stream_events():
            pass
        return ran, streamed

    ran, streamed = asyncio.run(run_and_stream())
    assert ran.final_output == streamed.final_output == "sunny" and len(cities) == 2


def test_a_session_resends_the_whole_conversation_and_hits_the_cache(
    compat_server: Server,
) -> None:
    """The SDK's own session memory sends every earlier item back (the tool's call with its
    id and status, its output, the user's turns): accepted as given, and rendered to the same
    prefix, so the second turn's prompt is a radix hit."""
    cities: list[str] = []
    agent = _forecaster(compat_server, cities)
    session = agents.SQLiteSession(uuid.uuid4().hex)

    async def two_turns() -> tuple[Any, Any, list[Any]]:
        first = await agents.Runner.run(agent, "Weather in Oslo?", session=session)
        second = await agents.Runner.run(agent, "And in Paris?", session=session)
        return first, second, await session.get_items()

    first, second, items = asyncio.run(two_turns())
    assert len(cities) == 2 and first.final_output == second.final_output == "sunny"
    kinds = [item.get("type", "message") for item in items]
    assert kinds == ["message", "function_call", "function_call_output"] * 2, kinds
    # everything the first turn's request rendered is again the second's prefix
    before, usage = first.raw_responses[-1].usage.input_tokens, second.raw_responses[-1].usage
    assert usage.input_tokens > before
    assert usage.input_tokens_details.cached_tokens >= before - 3, (before, usage)


def test_a_streamed_run_with_a_tool(compat_server: Server) -> None:
    cities: list[str] = []
    agent = _forecaster(compat_server, cities)

    async def run() -> tuple[Any, list[str]]:
        result = agents.Runner.run_streamed(agent, "Weather in Oslo?")
        kinds = [event.type async for event in result.stream_events()]
        return result, kinds

    result, kinds = asyncio.run(run())
    assert cities and result.final_output == "sunny"
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds


def test_a_structured_output_and_a_chained_run(compat_server: Server) -> None:
    """``output_type`` reaches the grammar as a strict JSON schema (the SDK parses the answer
    into the model), and a run chained by ``previous_response_id`` goes on from it."""
    from pydantic import BaseModel

    class Forecast(BaseModel):
        city: Literal["Paris", "Oslo"]
        sunny: bool

    agent = _agent(
        compat_server, output_type=Forecast, model_settings=agents.ModelSettings(max_tokens=64)
    )

    async def two_runs() -> tuple[Any, Any]:
        first = await agents.Runner.run(agent, "Forecast for Paris.")
        chained = await agents.Runner.run(
            agent, "And for Oslo?", previous_response_id=first.last_response_id
        )
        return first, chained

    first, chained = asyncio.run(two_runs())
    assert isinstance(first.final_output, Forecast)
    assert isinstance(chained.final_output, Forecast)
    usage = chained.raw_responses[-1].usage
    assert (
        usage.input_tokens_details.cached_tokens >= first.raw_responses[-1].usage.input_tokens - 3
    )


def test_a_conversation_session_and_a_run_in_a_conversation(compat_server: Server) -> None:
    """The SDK's ``OpenAIConversationsSession`` keeps its items in the server's conversation
    (made, listed, added to by the SDK); ``Runner.run(conversation_id=...)`` sends only each
    turn's new input, the server rendering the conversation before it (a radix hit)."""
    from openai import AsyncOpenAI

    cities: list[str] = []
    agent = _forecaster(compat_server, cities)
    client = AsyncOpenAI(base_url=f"{compat_server.url}/v1", api_key="unused", max_retries=0)

    async def runs() -> tuple[list[Any], Any, Any]:
        session = agents.OpenAIConversationsSession(openai_client=client)
        await agents.Runner.run(agent, "Weather in Oslo?", session=session)
        await agents.Runner.run(agent, "And in Paris?", session=session)
        kept = await session.get_items()
        conv = await client.conversations.create()
        first = await agents.Runner.run(agent, "Weather in Oslo?", conversation_id=conv.id)
        second = await agents.Runner.run(agent, "And in Paris?", conversation_id=conv.id)
        return kept, first, second

    kept, first, second = asyncio.run(runs())
    assert len(cities) == 4
    kinds = [item.get("type", "message") for item in kept]
    assert kinds == ["message", "function_call", "function_call_output"] * 2, kinds
    before, usage = first.raw_responses[-1].usage.input_tokens, second.raw_responses[-1].usage
    assert usage.input_tokens > before
    assert usage.input_tokens_details.cached_tokens >= before - 3, (before, usage)


@pytest.mark.slow  # a server of its own: the SDK compacts only for a model named as OpenAI's
def test_the_sdks_compaction_session_compacts_here(tools_model_dir: Path, tmp_path: Path) -> None:
    """``OpenAIResponsesCompactionSession`` calls ``responses.compact``: the session's history
    becomes its user messages and a compaction item, and the next turn runs on it."""
    from openai import AsyncOpenAI

    name = "gpt-tiny"
    args = ["--model", str(tools_model_dir), "--served-model-name", name]
    with serving([*args, "--allow-auto-truncate"], tmp_path / "server.log") as server:
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        cities: list[str] = []
        agent = _forecaster(server, cities, model=name)
        session = agents.OpenAIResponsesCompactionSession(
            uuid.uuid4().hex,
            agents.SQLiteSession(uuid.uuid4().hex),
            client=client,
            model=name,
        )

        async def two_turns() -> tuple[list[Any], list[Any]]:
            # a turn that ends on a local tool's output defers the session's own compaction
            # to the next model response: each turn's is asked for here
            await agents.Runner.run(agent, "Weather in Oslo?", session=session)
            await session.run_compaction({"force": True})
            after_one = await session.get_items()
            await agents.Runner.run(agent, "And in Paris?", session=session)
            await session.run_compaction({"force": True})
            return after_one, await session.get_items()

        after_one, after_two = asyncio.run(two_turns())
    assert len(cities) == 2
    kinds = [item.get("type", "message") for item in after_one]
    assert kinds == ["message", "compaction"], after_one
    kinds = [item.get("type", "message") for item in after_two]
    assert kinds == ["message", "message", "compaction"], after_two
