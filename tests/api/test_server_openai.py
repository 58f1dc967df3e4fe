"""The OpenAI routes through the official ``openai`` client and raw SSE through httpx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from serving_harness import Server, model_name, pick_stop


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE response; the last must be ``[DONE]``."""
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    payloads = [line[len("data: ") :] for line in lines]
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def test_models_lists_the_served_model(
    server: Server, openai_client: Any, api_model_dir: Path
) -> None:
    """The model id is the path as given, as SGLang reports it (clients load the tokenizer
    from it)."""
    models = openai_client.models.list().data
    assert len(models) == 1 and models[0].id == model_name(server) == str(api_model_dir)


def test_completion_non_stream_usage(openai_client: Any, server: Server) -> None:
    resp = openai_client.completions.create(
        model=model_name(server), prompt="def main():", max_tokens=7, temperature=0
    )
    choice = resp.choices[0]
    assert resp.object == "text_completion" and choice.index == 0
    assert isinstance(choice.text, str)
    usage = resp.usage
    assert usage.completion_tokens <= 7
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 7
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > 0
    assert usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens


def test_completion_batch_prompts_with_n(openai_client: Any) -> None:
    resp = openai_client.completions.create(
        model="tiny-llama",
        prompt=["import os", "class A:"],
        max_tokens=4,
        n=2,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in resp.choices)
    assert resp.usage.completion_tokens == 16
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 16


def test_completion_stream_one_finish_chunk_per_choice(
    server: Server, client: httpx.Client
) -> None:
    body = {
        "prompt": "for i in range(3):",
        "max_tokens": 6,
        "n": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    finishes: dict[int, int] = {}
    texts = {0: "", 1: "", 2: ""}
    for event in events[:-1]:
        (choice,) = event["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finishes[choice["index"]] = finishes.get(choice["index"], 0) + 1
            assert choice["finish_reason"] == "length"
    assert finishes == {0: 1, 1: 1, 2: 1}
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == []
    assert usage["completion_tokens"] == 18
    assert usage["total_tokens"] == usage["prompt_tokens"] + 18


def test_chat_non_stream_and_stream_agree(openai_client: Any) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
    ]
    kwargs = dict(model="tiny-llama", messages=messages, max_tokens=8, temperature=0)
    whole = openai_client.chat.completions.create(**kwargs)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(
        openai_client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == msg.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
        whole.usage.completion_tokens
    )


def test_chat_stream_n_choices_end_with_done(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 5,
        "n": 2,
        "stream": True,
        "ignore_eos": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        events = sse_events(resp)
    per_choice: dict[int, list[str | None]] = {0: [], 1: []}
    for event in events:
        for choice in event["choices"]:
            per_choice[choice["index"]].append(choice["finish_reason"])
    for reasons in per_choice.values():
        assert reasons[-1] == "length"
        assert [r for r in reasons if r is not None] == ["length"]


def test_cached_tokens_grow_across_turns(openai_client: Any) -> None:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "A long shared system prompt. " * 8},
    ]
    cached = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question number {turn}: what is {turn}+1?"})
        resp = openai_client.chat.completions.create(
            model="tiny-llama", messages=messages, max_tokens=6, temperature=0
        )
        cached.append(resp.usage.prompt_tokens_details.cached_tokens)
        assert cached[-1] < resp.usage.prompt_tokens
        messages.append({"role": "assistant", "content": resp.choices[0].message.content})
    assert cached[0] >= 0
    assert cached[1] > cached[0] and cached[2] > cached[1], cached


def test_chat_logprobs(openai_client: Any) -> None:
    resp = openai_client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == 3
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob


def test_completion_logprobs_and_stop(openai_client: Any) -> None:
    resp = openai_client.completions.create(
        model="tiny-llama",
        prompt="x = 1",
        max_tokens=4,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    # the token itself and the top 3: up to logprobs + 1 entries, as OpenAI and vLLM give
    assert all(tok in t and len(t) <= 4 for tok, t in zip(lp.tokens, lp.top_logprobs, strict=True))
    text = openai_client.completions.create(
        model="tiny-llama", prompt="x = 1", max_tokens=12, temperature=0
    ).choices[0]
    stop = pick_stop(text.text)
    if stop is not None:
        stopped = openai_client.completions.create(
            model="tiny-llama", prompt="x = 1", max_tokens=12, temperature=0, stop=[stop]
        ).choices[0]
        assert stopped.text == text.text[: text.text.find(stop)]
        assert stopped.finish_reason == "stop"
