"""SGLang's native API and the server routes: /generate (single, batch, stream, input_ids,
logprobs), /abort_request, /flush_cache, /get_model_info, /get_server_info, /metrics."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx
from serving_harness import paused, pick_stop

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def stream_events(client: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def test_generate_single(client: httpx.Client) -> None:
    out = client.post("/generate", json={"text": "def f(x):", "sampling_params": GREEDY}).json()
    meta = out["meta_info"]
    assert meta["completion_tokens"] == len(out["output_ids"]) == 6
    assert meta["finish_reason"] == {"type": "length", "matched": None, "length": 6}
    assert meta["prompt_tokens"] > 0 and meta["cached_tokens"] >= 0 and meta["id"]
    assert isinstance(out["text"], str)


def test_generate_batch_text_and_input_ids(client: httpx.Client) -> None:
    single = client.post("/generate", json={"text": "import sys", "sampling_params": GREEDY}).json()
    batch = client.post(
        "/generate",
        json={
            "text": ["import sys", "x = [1, 2]"],
            "sampling_params": [GREEDY, {**GREEDY, "max_new_tokens": 3}],
        },
    ).json()
    assert [len(b["output_ids"]) for b in batch] == [6, 3]
    assert batch[0]["output_ids"] == single["output_ids"]  # greedy: batching changes nothing
    by_ids = client.post(
        "/generate", json={"input_ids": [[5, 6, 7], [8, 9, 10, 11]], "sampling_params": GREEDY}
    ).json()
    assert [b["meta_info"]["prompt_tokens"] for b in by_ids] == [3, 4]
    one = client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": GREEDY})
    assert one.json()["output_ids"] == by_ids[0]["output_ids"]


def test_generate_stream_is_cumulative_and_ends_with_done(client: httpx.Client) -> None:
    whole = client.post("/generate", json={"text": "while True:", "sampling_params": GREEDY}).json()
    events = stream_events(client, {"text": "while True:", "sampling_params": GREEDY})
    assert events[-1]["text"] == whole["text"]
    assert events[-1]["output_ids"] == whole["output_ids"]
    for a, b in zip(events, events[1:], strict=False):
        assert b["text"].startswith(a["text"])
    assert [e["meta_info"]["finish_reason"] is None for e in events].count(False) == 1


def test_generate_batch_stream_has_indices(client: httpx.Client) -> None:
    events = stream_events(client, {"text": ["a = 1", "b = 2"], "sampling_params": GREEDY})
    finished = sorted(e["index"] for e in events if e["meta_info"]["finish_reason"])
    assert finished == [0, 1]


def test_generate_logprobs(client: httpx.Client) -> None:
    out = client.post(
        "/generate",
        json={
            "text": "print('hi')",
            "sampling_params": GREEDY,
            "return_logprob": True,
            "top_logprobs_num": 2,
            "logprob_start_len": 0,
            "return_text_in_logprobs": True,
        },
    ).json()
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == 6
    for (lp, tid, text), top in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert lp <= 0 and isinstance(tid, int) and isinstance(text, str)
        assert len(top) == 2 and top[0][0] == max(t[0] for t in top)
        assert abs(top[0][0] - lp) < 1e-4  # greedy: the chosen token is the top one
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == meta["prompt_tokens"] and inputs[0][0] is None


def test_prompt_logprobs_from_a_start_position(client: httpx.Client) -> None:
    """Each entry pairs a prompt token with its own logprob, whatever logprob_start_len is."""

    def prompt_logprobs(start: int) -> list[list]:
        body = {
            "text": "def add(a, b): return a + b",
            "sampling_params": {**GREEDY, "max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": start,
        }
        return client.post("/generate", json=body).json()["meta_info"]["input_token_logprobs"]

    full, tail = prompt_logprobs(0), prompt_logprobs(3)
    assert [t for _, t, _ in tail] == [t for _, t, _ in full[3:]]
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(tail, full[3:], strict=True))


def test_stop_string_is_trimmed(client: httpx.Client) -> None:
    out = client.post(
        "/generate", json={"text": "x = ", "sampling_params": {**GREEDY, "max_new_tokens": 16}}
    ).json()
    text = out["text"]
    stop = pick_stop(text)
    assert stop is not None, text
    stopped = client.post(
        "/generate",
        json={"text": "x = ", "sampling_params": {**GREEDY, "max_new_tokens": 16, "stop": stop}},
    ).json()
    assert stopped["text"] == text[: text.find(stop)]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_abort_request_route(server: Any, client: httpx.Client) -> None:
    """A request aborted by rid, held queued by an in-place pause so the abort reaches it
    before its end however busy the machine (the abort applies when the steps resume)."""
    result: dict[str, Any] = {}

    def run() -> None:
        with server.client() as c:
            body = {
                "text": "long one",
                "rid": "abort-me",
                "sampling_params": {"max_new_tokens": 900, "ignore_eos": True},
            }
            result["out"] = c.post("/generate", json=body).json()

    thread = threading.Thread(target=run)
    with paused(client):
        thread.start()
        while client.get("/get_server_info").json()["scheduler"]["num_waiting_reqs"] != 1:
            assert thread.is_alive(), result
        aborted = client.post("/abort_request", json={"rid": "abort-me"}).json()["aborted"]
    thread.join(60)
    assert aborted == ["abort-me"]
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["completion_tokens"] == 0


def test_flush_cache_and_server_info(client: httpx.Client) -> None:
    client.post("/generate", json={"text": "cache me " * 10, "sampling_params": GREEDY})
    info = client.get("/get_server_info").json()
    assert info["integrity_ok"] is True
    assert info["scheduler"]["num_cached_tokens_in_tree"] > 0
    assert client.post("/flush_cache").status_code == 200
    info = client.get("/get_server_info").json()
    assert info["scheduler"]["num_cached_tokens_in_tree"] == 0
    assert info["integrity_ok"] is True
    model = client.get("/get_model_info").json()
    assert model["is_generation"] and model["max_context_len"] == 1024


def metric(text: str, name: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        total += float(m.group(1))
    return total


def test_metrics_counters_move(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    client.post("/generate", json={"text": ["m1", "m2"], "sampling_params": GREEDY})
    after = client.get("/metrics").text
    for name in (
        "radixserve:generation_tokens_total",
        "radixserve:time_to_first_token_seconds_count",
        "radixserve:e2e_request_latency_seconds_count",
        "radixserve:num_requests_total",
    ):
        assert metric(after, name) > metric(before, name), name
    assert (
        metric(after, "radixserve:generation_tokens_total")
        - metric(before, "radixserve:generation_tokens_total")
        == 12
    )
    assert metric(after, "radixserve:inter_token_latency_seconds_count") > 0
    for name in ("num_running_reqs", "num_waiting_reqs", "token_usage", "cache_hit_rate"):
        assert f"radixserve:{name}{{" in after, name
    assert "radixserve:num_retracted_reqs_total" in after
    assert "radixserve:num_preempted_reqs_total" in after
    assert "radixserve:gen_throughput" in after
