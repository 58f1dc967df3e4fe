"""``--tool-call-parser`` (SGLang's names) overrides what the template teaches: Mistral's
``[TOOL_CALLS]`` format forced through the tiny model and read back with the openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_harness import Server, serving

pytest.importorskip("llguidance")

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
CALL = '\\{"name": "get_weather", "arguments": \\{"city": "[a-z]{3,6}"\\}\\}'
MISTRAL = f"Sure\\. \\[TOOL_CALLS\\] \\[{CALL}, {CALL}\\]"


@pytest.fixture(scope="module")
def mistral_server(
    tools_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("mistral-log") / "server.log"
    args = ["--model", str(tools_model_dir), "--served-model-name", "m"]
    with serving([*args, "--tool-call-parser", "mistral", "--max-total-tokens", "8192"], log) as s:
        yield s


@pytest.mark.slow  # a server of its own (the Mistral parser) for one check
def test_mistral_tool_calls_through_the_openai_client(mistral_server: Server) -> None:
    import openai

    oai = openai.OpenAI(base_url=f"{mistral_server.url}/v1", api_key="x", max_retries=0)
    choice = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        max_tokens=80,
        temperature=0,
        extra_body={"regex": MISTRAL},
    ).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    assert all(set(json.loads(c.function.arguments)) == {"city"} for c in calls)
