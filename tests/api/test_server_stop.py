"""Stop strings over HTTP, judged by the scheduler alone (the detokenizer only cuts): native
``/generate`` streamed and not, and ``/v1/completions`` through the official openai client.
The oracle: the tokenizer's decode of the server's own unstopped greedy output."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from stop_oracle import clean_span, expected

PROMPT = "def main():"
GREEDY = {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def unstopped(server: Any) -> list[int]:
    with server.client() as c:
        out = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).json()
    return list(out["output_ids"])


def native(client: httpx.Client, stop: str, stream: bool) -> dict[str, Any]:
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "stop": [stop]}, "stream": stream}
    if not stream:
        return dict(client.post("/generate", json=body).json())
    with client.stream("POST", "/generate", json=body) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False)), "cumulative"
    return dict(events[-1])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("first,num_tokens", [(8, 22), (5, 2)])
def test_native_generate_stops_where_the_text_first_holds_the_stop(
    client: httpx.Client,
    tiny_tokenizer: Any,
    unstopped: list[int],
    stream: bool,
    first: int,
    num_tokens: int,
) -> None:
    stop = clean_span(tiny_tokenizer, unstopped, first, num_tokens)
    want_ids, want_text = expected(tiny_tokenizer, unstopped, stop)
    out = native(client, stop, stream)
    assert out["output_ids"] == want_ids
    assert out["text"] == want_text
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_completion_with_a_long_stop_string(
    openai_client: Any, tiny_tokenizer: Any, unstopped: list[int], stream: bool
) -> None:
    stop = clean_span(tiny_tokenizer, unstopped, 8, 22)
    _, want_text = expected(tiny_tokenizer, unstopped, stop)
    args = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 60, "temperature": 0}
    extra = {"ignore_eos": True}
    if stream:
        chunks = list(
            openai_client.completions.create(**args, stop=[stop], stream=True, extra_body=extra)
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert text == want_text and reasons[-1] == "stop"
    else:
        out = openai_client.completions.create(**args, stop=[stop], extra_body=extra)
        assert out.choices[0].text == want_text and out.choices[0].finish_reason == "stop"
