"""The server on a Llama-3.2-1B-shaped random model with Llama 3.1's real tokenizer, given
``--chat-template`` (the checkpoint's own template has no tools): the prompt it renders, and
Llama 3's JSON tool calls read back by the official ``openai`` client, whole and streamed.
The calls are forced through the random model with a regex (SGLang's field)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_harness import Server, serving

from radixserve.models.checkpoint_shapes import TEMPLATES

pytest.importorskip("llguidance")
# slow: a 1B-shaped checkpoint's server for two checks (about 16 s); .ci/run runs them after
# the default suite
pytestmark = pytest.mark.slow

TEMPLATE = TEMPLATES / "llama3.1_json_tools.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '\\{"name": "get_weather", "parameters": \\{"city": "[A-Z][a-z]{2,6}"\\}\\}'
TWO_CALLS = f"<\\|python_tag\\|>{CALL}; {CALL}"
MESSAGES = [{"role": "user", "content": "Weather in Paris and Rome?"}]


@pytest.fixture(scope="module")
def llama_server(
    llama3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("llama3-log") / "server.log"
    args = ["--model", str(llama3_model_dir), "--served-model-name", "llama3"]
    args += ["--chat-template", str(TEMPLATE), "--max-total-tokens", "8192"]
    with serving(args, log) as server:
        yield server


@pytest.fixture
def oai(llama_server: Server):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=f"{llama_server.url}/v1", api_key="unused", max_retries=0)


def test_chat_template_file_renders_the_prompt(oai, checkpoint_tokenizers) -> None:  # type: ignore[no-untyped-def]
    tokenizer = checkpoint_tokenizers["llama3"]  # carries the same template file
    assert tokenizer.chat_template == TEMPLATE.read_text()
    expected = tokenizer.apply_chat_template(
        MESSAGES, tools=[WEATHER], tokenize=True, add_generation_prompt=True
    )
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    out = oai.chat.completions.create(
        model="llama3", messages=MESSAGES, tools=[WEATHER], max_tokens=1, temperature=0
    )
    assert out.usage.prompt_tokens == len(expected)


def _chat(oai, stream: bool):  # type: ignore[no-untyped-def]
    return oai.chat.completions.create(
        model="llama3",
        messages=MESSAGES,
        tools=[WEATHER],
        max_tokens=64,
        temperature=0,
        stream=stream,
        extra_body={"regex": TWO_CALLS},
    )


def test_llama3_tool_calls_whole_and_streamed(oai) -> None:  # type: ignore[no-untyped-def]
    choice = _chat(oai, stream=False).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert [name for name, _ in calls] == ["get_weather", "get_weather"]
    assert all(set(args) == {"city"} for _, args in calls)
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state = ChatCompletionStreamState()  # how the official client assembles a stream
    for chunk in _chat(oai, stream=True):
        state.handle_chunk(chunk)
    final = state.get_final_completion().choices[0]
    finish = final.finish_reason
    streamed = [
        (c.function.name, json.loads(c.function.arguments)) for c in final.message.tool_calls
    ]
    assert streamed == calls and finish == "tool_calls"


def test_a_required_call_is_in_llamas_own_words(oai) -> None:  # type: ignore[no-untyped-def]
    """A required call is written as the Llama 3.1 template renders one (``call_form.py``)."""
    tool = {"type": "object", "properties": {"tz": {"const": "UTC"}}, "required": ["tz"]}
    tool["additionalProperties"] = False
    choice = oai.chat.completions.create(
        model="llama3",
        messages=MESSAGES,
        tools=[{"type": "function", "function": {"name": "utc_time", "parameters": tool}}],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
        logprobs=True,
    ).choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert calls == [("utc_time", {"tz": "UTC"})]
    written = "".join(t.token for t in choice.logprobs.content)
    assert written.startswith('{"name": "utc_time", "parameters": {"tz": "UTC"}}'), written
