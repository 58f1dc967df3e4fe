"""OpenAI's Agents SDK (``openai-agents``), unchanged, running an agent with a function tool
against a real server through the Responses API: a required tool choice makes the random
model call the tool, the SDK runs it and ends on its output. ``parallel_tool_calls=False``
reaches the grammar (at most one call), so the sampled call is one whole JSON object."""

from __future__ import annotations

import asyncio
import uuid
from typing import Literal

import pytest
from serving_harness import Server
from test_server_tools import MODEL

pytestmark = pytest.mark.timeout(180)


def test_an_agent_calls_its_function_tool(compat_server: Server) -> None:
    agents = pytest.importorskip("agents", reason="needs openai-agents (the test extra)")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no export to OpenAI's service
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather of a city."""
        cities.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=f"{compat_server.url}/v1", api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="forecaster",
        instructions=f"You are agent {uuid.uuid4().hex}; answer with the weather tool.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=256
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?"))
    assert len(cities) == 1 and cities[0] in {"Paris", "Oslo"}
    assert result.final_output == "sunny"
