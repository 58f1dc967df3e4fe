"""The server on a random model that carries a real checkpoint's tokenizer and template
(Qwen3-0.6B's shape shrunk, the real 151,936-row vocabulary), with ``--reasoning-parser
qwen3``, read with the official ``openai`` client: the requests that killed it, and the
thinking separated as ``reasoning_content`` (each format forced through the random model by
a regex, SGLang's field, which constrains the whole output as written)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_harness import Server, prompt_tokens, serving

pytest.importorskip("llguidance")

THINK = "<think>\n[a-z]{4}\n</think>\n\n[a-z ]{1,12}"
TOOL_CALL = '<tool_call>\n\\{"name": "[a-z_]{1,8}", "arguments": \\{\\}\\}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3_server(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("qwen3-log") / "server.log"
    args = ["--model", str(qwen3_model_dir), "--served-model-name", "qwen3"]
    args += ["--reasoning-parser", "qwen3"]
    with serving([*args, "--max-total-tokens", "8192"], log) as server:
        yield server


@pytest.mark.parametrize("pattern", [THINK, TOOL_CALL], ids=["think", "tool_call"])
def test_a_regex_over_qwen3_added_tokens_is_served(qwen3_server: Server, pattern: str) -> None:
    with qwen3_server.client() as http:
        for temperature in (0.0, 1.0):
            resp = http.post(
                "/v1/chat/completions",
                json={
                    "model": "qwen3",
                    "messages": [{"role": "user", "content": "Think, then answer."}],
                    "regex": pattern,
                    "max_tokens": 64,
                    "temperature": temperature,
                },
            )
            assert resp.status_code == 200, resp.text
            choice = resp.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            message = choice["message"]
            thinking = message["reasoning_content"]
            text = "" if thinking is None else f"<think>{thinking}</think>"
            assert re.fullmatch(pattern, text + message["content"]), choice
            assert (thinking is None) == (pattern == TOOL_CALL)
        assert http.get("/health").status_code == 200
        info = http.get("/get_server_info").json()
        assert info["scheduler"]["num_failed_reqs"] == 0, info["scheduler"]


@pytest.fixture
def oai(qwen3_server: Server):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=f"{qwen3_server.url}/v1", api_key="unused", max_retries=0)


def _chat(oai, stream: bool = False, **extra):  # type: ignore[no-untyped-def]
    return oai.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": "What is 6 x 7?"}],
        max_tokens=48,
        temperature=0,
        stream=stream,
        extra_body={"regex": THINK, **extra},
    )


def test_reasoning_content_streamed_equals_whole(oai) -> None:  # type: ignore[no-untyped-def]
    whole = _chat(oai).choices[0].message
    assert re.fullmatch("\n[a-z]{4}\n", whole.reasoning_content)
    assert re.fullmatch("\n\n[a-z ]{1,12}", whole.content)
    reasoning = content = ""
    kinds = []
    for chunk in _chat(oai, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            r = getattr(delta, "reasoning_content", None)
            reasoning += r or ""
            content += delta.content or ""
            kinds.append("r" if r else "c" if delta.content else "-")
    assert (reasoning, content) == (whole.reasoning_content, whole.content)
    assert "".join(kinds).strip("-").index("c") > 0  # the thinking comes first, as deltas
    held = ""
    for chunk in _chat(oai, stream=True, stream_reasoning=False):
        parts = [getattr(c.delta, "reasoning_content", None) for c in chunk.choices]
        held += "".join(p for p in parts if p)
        if any(parts):
            assert held == whole.reasoning_content  # in one delta, once the thinking ends


def test_separate_reasoning_false_and_thinking_off_keep_the_text(oai) -> None:  # type: ignore[no-untyped-def]
    whole = _chat(oai).choices[0].message
    kept = _chat(oai, separate_reasoning=False).choices[0].message
    assert kept.content == f"<think>{whole.reasoning_content}</think>{whole.content}"
    assert getattr(kept, "reasoning_content", None) is None
    off = _chat(oai, chat_template_kwargs={"enable_thinking": False}).choices[0].message
    assert getattr(off, "reasoning_content", None) is None and off.content.startswith("<think>")


def test_generate_separates_reasoning_when_asked(qwen3_server: Server) -> None:
    body = {
        "text": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "sampling_params": {"max_new_tokens": 48, "temperature": 0, "regex": THINK},
    }
    with qwen3_server.client() as http:
        plain = http.post("/generate", json=body).json()
        split = http.post("/generate", json={**body, "separate_reasoning": True}).json()
        assert "reasoning_text" not in plain
        assert f"<think>{split['reasoning_text']}</think>{split['text']}" == plain["text"]
        events = []
        with http.stream(
            "POST", "/generate", json={**body, "separate_reasoning": True, "stream": True}
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[len("data: ") :]))
        last = events[-1]
        assert (last["reasoning_text"], last["text"]) == (split["reasoning_text"], split["text"])
        for before, after in zip(events, events[1:], strict=False):  # cumulative, as SGLang
            assert after["text"].startswith(before["text"])
            assert (after["reasoning_text"] or "").startswith(before["reasoning_text"] or "")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\\n\\{"name": "get_weather", "arguments": \\{"city": "[A-Z][a-z]{2,6}"\\}\\}\\n</tool_call>'
THINK_THEN_CALLS = f"<think>\\n[a-z]{{4}}\\n</think>\\n\\nOn it\\.\\n{CALL}\\n{CALL}"


def test_thinking_and_tool_calls_in_one_answer(oai) -> None:  # type: ignore[no-untyped-def]
    def chat(stream: bool):  # type: ignore[no-untyped-def]
        return oai.chat.completions.create(
            model="qwen3",
            messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
            tools=[WEATHER],
            max_tokens=96,
            temperature=0,
            stream=stream,
            extra_body={"regex": THINK_THEN_CALLS},
        )

    choice = chat(False).choices[0]
    message = choice.message
    assert choice.finish_reason == "tool_calls"
    assert re.fullmatch("\\n[a-z]{4}\\n", message.reasoning_content)
    assert message.content == "\n\nOn it."
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    assert len(calls) == 2 and all(name == "get_weather" for name, _ in calls)
    reasoning = content = ""
    assembled: dict[int, dict[str, str]] = {}
    for chunk in chat(True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
            for delta in c.delta.tool_calls or []:
                entry = assembled.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)
    streamed = [(e["name"], json.loads(e["arguments"])) for _, e in sorted(assembled.items())]
    assert streamed == calls


UTC_TIME = {
    "type": "function",
    "function": {
        "name": "utc_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"const": "UTC"}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}


def test_a_required_call_after_the_thinking_is_in_qwen3s_own_words(oai) -> None:  # type: ignore[no-untyped-def]
    """With ``--reasoning-parser``, a required call's grammar starts after ``</think>`` (a
    logit bias makes the random model write it first), and the call is written as Qwen3's
    template renders one (``call_form.py``), then read back into ``tool_calls``."""
    think_end = 151668
    choice = oai.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": "What time is it?"}],
        tools=[UTC_TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
        logit_bias={str(think_end): 100},
        logprobs=True,
    ).choices[0]
    written = "".join(t.token for t in choice.logprobs.content)
    assert choice.finish_reason == "tool_calls", (written, choice.message.content)
    assert choice.message.content is None
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert calls == [("utc_time", {"tz": "UTC"})]
    call = '<tool_call>\n{"name": "utc_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    assert written.startswith("</think>\n\n" + call), written


def test_the_thinking_is_a_block_and_an_item_on_the_other_doors(qwen3_server: Server) -> None:
    """Anthropic's ``thinking`` block and the Responses API's ``reasoning`` item come from the
    chat route's reasoning parser (the format forced by SGLang's ``regex``)."""
    import anthropic
    import openai

    claude = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0)
    msg = claude.messages.create(
        model="qwen3",
        messages=[{"role": "user", "content": "Think, then answer."}],
        max_tokens=48,
        extra_body={"regex": THINK},
    )
    assert [block.type for block in msg.content] == ["thinking", "text"]
    assert re.fullmatch("\\n[a-z]{4}\\n", msg.content[0].thinking), msg.content  # type: ignore[union-attr]
    oai = openai.OpenAI(base_url=f"{qwen3_server.url}/v1", api_key="unused", max_retries=0)
    resp = oai.responses.create(
        model="qwen3",
        input="Think, then answer.",
        max_output_tokens=48,
        extra_body={"regex": THINK},
    )
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert re.fullmatch("[a-z ]{1,12}", resp.output_text.strip() or "x"), resp.output_text


# a fixed thinking and call opening (jump-forward writes them in the tokenizer's own tokens),
# then a city the model picks: what comes before it was run through the model, so it is cached
THINK_THEN_CITY = (
    '<think>\nsunny\n</think>\n\n<tool_call>\n\\{"name": "get_weather", "arguments": '
    '\\{"city": "[A-Z][a-z]{2,6}"\\}\\}\n</tool_call>'
)


def test_a_tool_loops_thinking_is_rendered_again_a_cache_hit(qwen3_server: Server) -> None:
    """Qwen3's template keeps the thinking of the turns since the last user message. Sent back
    (a Responses ``reasoning`` item, chained or re-sent; an Anthropic ``thinking`` block), the
    next turn renders the answer as the model wrote it, thinking included, so its prompt finds
    the answer cached past the thinking (dropped, the prompt would part from it at once)."""
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=f"{qwen3_server.url}/v1", api_key="unused", max_retries=0)
    tool: Any = {"type": "function", **WEATHER["function"]}
    task: Any = {"role": "user", "content": f"Weather, agent {uuid.uuid4().hex}?"}
    kwargs: Any = dict(model="qwen3", tools=[tool], temperature=0)
    first = oai.responses.create(
        **kwargs, input=[task], max_output_tokens=64, extra_body={"regex": THINK_THEN_CITY}
    )
    assert [item.type for item in first.output] == ["reasoning", "function_call"], first.output
    call = first.output[1]
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    past = first.usage.input_tokens + 12  # the thinking and the call's opening are more
    chained = oai.responses.create(
        **kwargs, previous_response_id=first.id, input=[result], max_output_tokens=1
    )
    assert chained.usage.input_tokens_details.cached_tokens >= past, (first.usage, chained.usage)
    items = [task, *(item.model_dump(exclude_none=True) for item in first.output), result]
    resent = oai.responses.create(**kwargs, input=items, store=False, max_output_tokens=1)
    assert resent.usage.input_tokens_details.cached_tokens >= past, resent.usage

    claude = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0)
    ask: Any = {"role": "user", "content": f"Weather, agent {uuid.uuid4().hex}?"}
    tools: Any = [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]
    answer = claude.messages.create(
        model="qwen3",
        messages=[ask],
        tools=tools,
        max_tokens=64,
        extra_body={"regex": THINK_THEN_CITY, "temperature": 0},
    )
    assert [block.type for block in answer.content] == ["thinking", "tool_use"], answer.content
    turn: Any = {"role": "assistant", "content": [b.model_dump() for b in answer.content]}
    back: Any = {"type": "tool_result", "tool_use_id": answer.content[1].id, "content": "sunny"}
    again = claude.messages.create(
        model="qwen3",
        messages=[ask, turn, {"role": "user", "content": [back]}],
        tools=tools,
        max_tokens=1,
    )
    total = prompt_tokens(answer)
    assert (again.usage.cache_read_input_tokens or 0) >= total + 12, (answer.usage, again.usage)


def test_each_doors_reasoning_switch_reaches_the_template(oai, qwen3_server: Server) -> None:  # type: ignore[no-untyped-def]
    """Chat's ``reasoning_effort`` (``none``: no thinking), the Responses API's
    ``reasoning.effort`` and Anthropic's ``thinking`` render Qwen3's real template as
    ``enable_thinking`` does (its prompt closes an empty ``<think>`` when off: more tokens),
    and the thinking is then not separated."""
    import anthropic

    messages = [{"role": "user", "content": "What is 6 x 7?"}]

    def prompt_tokens(**extra: Any) -> int:
        answer = oai.chat.completions.create(
            model="qwen3", messages=messages, max_tokens=1, extra_body=extra
        )
        return int(answer.usage.prompt_tokens)

    off = prompt_tokens(chat_template_kwargs={"enable_thinking": False})
    on = prompt_tokens(chat_template_kwargs={"enable_thinking": True})
    assert off > on
    assert prompt_tokens(reasoning_effort="none") == off
    assert prompt_tokens(reasoning_effort="low") == on
    # what the client gives in chat_template_kwargs wins over the effort
    assert (
        prompt_tokens(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}) == on
    )
    quiet = _chat(oai, reasoning_effort="none").choices[0].message
    assert getattr(quiet, "reasoning_content", None) is None and quiet.content.startswith("<think>")
    count = oai.responses.input_tokens.count
    assert count(model="qwen3", input=messages, reasoning={"effort": "none"}).input_tokens == off
    assert count(model="qwen3", input=messages, reasoning={"effort": "high"}).input_tokens == on
    claude = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0)
    disabled: Any = {"type": "disabled"}
    enabled: Any = {"type": "enabled", "budget_tokens": 1024}
    kwargs: Any = dict(model="qwen3", messages=messages)
    assert claude.messages.count_tokens(**kwargs, thinking=disabled).input_tokens == off
    assert claude.messages.count_tokens(**kwargs, thinking=enabled).input_tokens == on


def test_clearing_thinking_renders_the_loop_as_sent_without_it(qwen3_server: Server) -> None:
    """Anthropic's ``clear_thinking_20251015`` through Qwen3's real template, which renders the
    thinking of the turns since the last user message: the older turns' thinking is gone from
    the prompt as if never sent (the oracle: that conversation counted), the last turn's kept,
    and the response reports the turns and tokens cleared."""
    import anthropic

    claude = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0)
    tools: Any = [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]

    def loop(kept: int) -> Any:
        out: list[Any] = [{"role": "user", "content": f"Weather, agent {uuid.uuid4().hex}?"}]
        for k in range(3):
            thinking = {"type": "thinking", "thinking": f"City {k} next.", "signature": ""}
            call = {"type": "tool_use", "id": f"t{k}", "name": "get_weather", "input": {}}
            back = {"type": "tool_result", "tool_use_id": f"t{k}", "content": "sunny"}
            blocks = [thinking, call] if k >= 3 - kept else [call]
            out += [{"role": "assistant", "content": blocks}, {"role": "user", "content": [back]}]
        return out

    sent = loop(3)
    without = [sent[0], *loop(1)[1:]]
    betas: Any = ["context-management-2025-06-27"]
    kwargs: Any = dict(model="qwen3", tools=tools, messages=sent, betas=betas)

    def count(messages: Any, edits: Any = None) -> Any:
        managed: Any = {"edits": edits} if edits is not None else anthropic.NOT_GIVEN
        return claude.beta.messages.count_tokens(
            **{**kwargs, "messages": messages}, context_management=managed
        )

    whole, hand = count(sent).input_tokens, count(without).input_tokens
    assert hand < whole - 8, (hand, whole)
    one: Any = [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
    counted = count(sent, one)
    assert counted.input_tokens == hand
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == whole
    assert count(sent, [{"type": "clear_thinking_20251015", "keep": "all"}]).input_tokens == whole
    msg = claude.beta.messages.create(**kwargs, max_tokens=1, context_management={"edits": one})
    assert msg.context_management is not None
    (applied,) = msg.context_management.applied_edits
    assert applied.type == "clear_thinking_20251015"
    assert applied.cleared_thinking_turns == 2  # type: ignore[union-attr]
    assert applied.cleared_input_tokens == whole - hand
    assert prompt_tokens(msg) == hand


CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_auto_calls_keep_to_strict_and_allowed_tools(oai) -> None:  # type: ignore[no-untyped-def]
    """``tool_choice: auto`` leaves the model free to answer or call; a strict tool's call is
    then kept to its parameters and an ``allowed_tools`` choice's to those tools, from the
    marker on (a logit bias makes the random model write ``<tool_call>`` first). Without
    either, the same request writes no call this server can read."""
    tool_call = 151657
    utc: Any = {**UTC_TIME, "function": {**UTC_TIME["function"], "strict": True}}

    def choice(tools: Any, **extra: Any) -> Any:
        return oai.chat.completions.create(
            model="qwen3",
            messages=[{"role": "user", "content": f"Weather, agent {uuid.uuid4().hex}?"}],
            tools=tools,
            parallel_tool_calls=False,
            max_tokens=48,
            temperature=0,
            logit_bias={str(tool_call): 100},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            **extra,
        ).choices[0]

    def calls(c: Any) -> list[tuple[str, Any]]:
        return [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]

    kept = choice([CITY])
    assert kept.finish_reason == "tool_calls", kept.message.content
    ((name, arguments),) = calls(kept)
    assert name == "get_weather" and arguments["city"] in ("Oslo", "Paris")
    loose = choice([{**CITY, "function": {**CITY["function"], "strict": False}}])
    assert not loose.message.tool_calls and "<tool_call>" in loose.message.content
    allowed: Any = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "auto",
            "tools": [{"type": "function", "function": {"name": "utc_time"}}],
        },
    }
    only = choice([CITY, utc], tool_choice=allowed)
    assert calls(only) == [("utc_time", {"tz": "UTC"})], only.message.content
    # a strict schema the grammar engine cannot take: a 400 naming the tool, as under required
    unique: Any = {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}}
    odd: Any = {
        "type": "function",
        "function": {"name": "odd", "strict": True, "parameters": unique},
    }
    import openai

    with pytest.raises(openai.BadRequestError, match="the parameters of `odd`: .*uniqueItems"):
        choice([CITY, odd])


def test_auto_calls_of_a_regex_custom_tool_match_it(oai) -> None:  # type: ignore[no-untyped-def]
    """A custom tool is kept to its parameters in ``auto`` mode, as a strict one: a call (the
    random model made to write ``<tool_call>`` first, a logit bias the Responses API does not
    take: ``test_call_form.py`` checks its grammar) carries an ``input`` that matches the
    tool's regex whole."""
    regex = "[a-z]{2,6}"
    fmt = {"type": "grammar", "grammar": {"syntax": "regex", "definition": regex}}
    shell: Any = {"type": "custom", "custom": {"name": "shell", "format": fmt}}
    kwargs: Any = dict(
        model="qwen3",
        parallel_tool_calls=False,
        temperature=0,
        extra_body={
            "logit_bias": {"151657": 100},  # <tool_call>
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    ask = f"Run something, agent {uuid.uuid4().hex}."
    chat = oai.chat.completions.create(
        **kwargs, messages=[{"role": "user", "content": ask}], tools=[shell], max_tokens=48
    ).choices[0]
    assert chat.finish_reason == "tool_calls", chat.message.content
    (call,) = chat.message.tool_calls
    assert call.type == "custom" and re.fullmatch(regex, call.custom.input), call
