"""``radixserve serve --dp-size 2 --worker-transport grpc``: two workers behind the real smg
gateway in its gRPC mode, its cache-aware routing on the workers' KV events (relayed by each
worker's ``SubscribeKvEvents``).

Slow: it starts two servers and the gateway. Conversations stay on one worker, steered by the
events (smg counts its event-driven hits in ``smg_cache_aware_policy_branch_total``); the
OpenAI routes and the native ``/generate`` go through the gateway's own tokenizer.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from serving_harness import Server, free_port, model_name, start_server, stop_server
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc
from test_data_parallel import NUM_CONVERSATIONS, NUM_TURNS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def grpc_dp(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Server, int]:
    pytest.importorskip("smg", reason="needs radixserve[router] (smg)")
    log = tmp_path_factory.mktemp("dp-grpc-log") / "dp.log"
    metrics = free_port()
    args = ["--model", str(api_model_dir), "--dp-size", "2", "--router", "smg"]
    args += ["--worker-transport", "grpc", "--threads-per-worker", "1"]
    args += ["--max-total-tokens", "16384", f"--router-arg=--prometheus-port={metrics}"]
    srv = start_server(args, log)
    yield srv, metrics  # type: ignore[misc]
    assert stop_server(srv, timeout=30) == 0, srv.log()[-4000:]


def grpc_workers(server: Server) -> list[str]:
    match = re.search(r"over 2 workers: grpc://(\S+) grpc://(\S+)", server.log())
    assert match, server.log()[-3000:]
    return [match.group(1), match.group(2)]


def finished_on(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        info = pb_grpc.SglangSchedulerStub(channel).GetServerInfo(pb.GetServerInfoRequest())
    return int(info.scheduler_info.fields["num_finished_reqs"].number_value)


def event_branches(metrics_port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found = re.findall(r'smg_cache_aware_policy_branch_total\{branch="(\w+)"\} (\S+)', text)
    return {branch: float(n) for branch, n in found}


def conversation(url: str, model: str, c: int) -> list[tuple[int, int, int]]:
    prompt = [100 + c, 7, 8, 9] * 6
    turns = []
    with httpx.Client(timeout=120) as client:
        for t in range(NUM_TURNS):
            body = {
                "model": model,  # smg's gRPC mode finds the workers by it
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            }
            out = client.post(f"{url}/generate", json=body).raise_for_status().json()
            out = out[0] if isinstance(out, list) else out
            turns.append((len(prompt), len(out["output_ids"]), out["meta_info"]["cached_tokens"]))
            prompt = prompt + out["output_ids"] + [200 + t, 11, 12, 13]
    return turns


def test_conversations_follow_the_kv_events(grpc_dp: tuple[Server, int]) -> None:
    server, metrics = grpc_dp
    model = model_name(server)
    with ThreadPoolExecutor(8) as pool:
        runs = list(
            pool.map(lambda c: conversation(server.url, model, c), range(NUM_CONVERSATIONS))
        )
    for turns in runs:
        for (prev_prompt, prev_out, _), (_, _, cached) in zip(turns, turns[1:], strict=False):
            assert cached == prev_prompt + prev_out - 1, turns
    finished = [finished_on(a) for a in grpc_workers(server)]
    assert sum(finished) >= NUM_CONVERSATIONS * NUM_TURNS
    assert all(f > 0 for f in finished), f"one worker got everything: {finished}"
    branches = event_branches(metrics)
    # every later turn was routed on the events to the worker holding its conversation
    assert branches.get("event_hit", 0) >= NUM_CONVERSATIONS * (NUM_TURNS - 1), branches


def test_openai_and_native_routes_through_the_gateway(grpc_dp: tuple[Server, int]) -> None:
    import openai

    server, _ = grpc_dp
    model = model_name(server)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
    )
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    done = client.completions.create(model=model, prompt="def f(x):", max_tokens=5, temperature=0)
    assert done.usage.completion_tokens == 5
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    with httpx.Client(timeout=120) as http:
        text = http.post(
            f"{server.url}/generate", json={"model": model, "text": "hi", "sampling_params": params}
        )
        assert text.status_code == 200, text.text
        out = text.json()
        out = out[0] if isinstance(out, list) else out
        assert len(out["output_ids"]) == 4 and isinstance(out["text"], str)
        bad = http.post(
            f"{server.url}/generate",
            json={"model": model, "text": "x", "sampling_params": {**params, "temperature": -1}},
        )
        assert 400 <= bad.status_code < 500, bad.text


def test_responses_and_conversations_held_by_the_gateway(grpc_dp: tuple[Server, int]) -> None:
    """In its gRPC mode smg holds stored responses and conversations itself: a chain by
    ``previous_response_id`` and the turns of a conversation go on whichever worker serves
    them."""
    import openai

    server, _ = grpc_dp
    model = model_name(server)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    first = client.responses.create(model=model, input="hello", max_output_tokens=3)
    for _ in range(4):
        chained = client.responses.create(
            model=model, input="again", previous_response_id=first.id, max_output_tokens=2
        )
        assert chained.usage.input_tokens > first.usage.input_tokens
    conv = client.conversations.create()
    for _ in range(3):
        client.responses.create(model=model, input="x", conversation=conv.id, max_output_tokens=2)
    listed = client.conversations.items.list(conv.id, limit=100).data
    assert [item.role for item in listed if item.type == "message"].count("user") == 3
