"""``radixserve serve --dp-size 2``: two workers behind the real gateway (smg) and the real
router (sglang-router), each test once per router (cache_aware).

Slow: it starts two servers and the router. Checks that a conversation's turns stay on one
worker (each turn hits exactly the previous turn's prompt plus answer, minus the last token),
that SGLang's native ``/generate`` works through the router in every shape a client sends
(text, token ids, batches, streaming, logprobs: the router adds fields of its own), that the
official ``openai`` client streams through it, and that killing a worker leaves the other
serving.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_harness import Server, final_response, model_name, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

NUM_CONVERSATIONS = 16
NUM_TURNS = 3


ROUTER_PACKAGES = {"smg": "smg", "sglang-router": "sglang_router"}


@pytest.fixture(scope="module", params=list(ROUTER_PACKAGES))
def dp_server(
    request: pytest.FixtureRequest, api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Server:
    router = request.param
    pytest.importorskip(ROUTER_PACKAGES[router], reason=f"needs radixserve[router] ({router})")
    log = tmp_path_factory.mktemp("dp-log") / "dp.log"
    srv = start_server(
        [
            "--model",
            str(api_model_dir),
            "--router",
            router,
            "--dp-size",
            "2",
            "--threads-per-worker",
            "1",
            "--max-total-tokens",
            "16384",
            "--log-level",
            "info",
        ],
        log,
    )
    yield srv  # type: ignore[misc]
    code = stop_server(srv, timeout=30)
    assert code == 0, srv.log()[-4000:]


def worker_urls(server: Server) -> list[str]:
    match = re.search(r"over 2 workers: (\S+) (\S+)", server.log())
    assert match, server.log()[-3000:]
    return [match.group(1), match.group(2)]


def conversation(url: str, c: int) -> list[tuple[int, int, int]]:
    """Turns of one conversation over /generate with token ids: (prompt_len, output_len,
    cached_tokens) per turn; each turn's prompt is the previous prompt, its answer and a new
    user turn."""
    prompt = [100 + c, 7, 8, 9] * 6
    turns = []
    with httpx.Client(timeout=120) as client:
        for t in range(NUM_TURNS):
            body = {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            }
            out = client.post(f"{url}/generate", json=body).raise_for_status().json()
            meta = out["meta_info"]
            turns.append((len(prompt), len(out["output_ids"]), meta["cached_tokens"]))
            prompt = prompt + out["output_ids"] + [200 + t, 11, 12, 13]
    return turns


def test_turns_stay_on_one_worker_and_the_openai_client_streams(dp_server: Server) -> None:
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda c: conversation(dp_server.url, c), range(NUM_CONVERSATIONS)))
    for turns in runs:
        for (prev_prompt, prev_out, _), (_, _, cached) in zip(turns, turns[1:], strict=False):
            assert cached == prev_prompt + prev_out - 1, turns
    finished = []
    for url in worker_urls(dp_server):
        stats = httpx.get(f"{url}/get_server_info", timeout=30).json()["scheduler"]
        finished.append(stats["num_finished_reqs"])
        load = httpx.get(f"{url}/get_load", timeout=30).json()
        assert load["load"] == 0 and load["num_waiting_reqs"] == 0
    assert sum(finished) == NUM_CONVERSATIONS * NUM_TURNS
    assert all(f > 0 for f in finished), f"one worker got everything: {finished}"

    import openai

    client = openai.OpenAI(base_url=f"{dp_server.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=model_name(dp_server),
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        stream=True,
    )
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def router_of(server: Server) -> str:
    match = re.search(r"ready at \S+: (\S+) \(", server.log())
    assert match, server.log()[-3000:]
    return match.group(1)


def test_native_generate_through_the_router(dp_server: Server) -> None:
    """Every shape of SGLang's /generate through the router: it forwards them with fields of
    its own added, which the workers take (docs/data_parallel.md, "Fields")."""
    url, params = f"{dp_server.url}/generate", {"max_new_tokens": 3, "temperature": 0}
    with httpx.Client(timeout=120) as client:
        one = client.post(url, json={"text": "hello", "sampling_params": params})
        assert one.status_code == 200, one.text
        assert len(one.json()["output_ids"]) == 3 and isinstance(one.json()["text"], str)
        ids = client.post(url, json={"input_ids": [5, 6, 7], "sampling_params": params}).json()
        assert ids["meta_info"]["prompt_tokens"] == 3 and len(ids["output_ids"]) == 3
        batch = client.post(url, json={"input_ids": [[5, 6], [7, 8, 9]], "sampling_params": params})
        assert batch.status_code == 200 and len(batch.json()) == 2, batch.text
        # a batch of texts: both routers' own /generate type takes one text (smg 1.13 and
        # sglang-router 0.3.2 answer 422 themselves; no worker sees it). A token-id batch works.
        texts = client.post(url, json={"text": ["a", "b c"], "sampling_params": params})
        assert texts.status_code == 422 and "expected a string" in texts.text, texts.text
        logprobs = client.post(
            url,
            json={
                "text": "hi",
                "sampling_params": params,
                "return_logprob": True,
                "top_logprobs_num": 2,
                "rid": "through-the-router",
            },
        ).json()
        assert logprobs["meta_info"]["id"] == "through-the-router"
        assert len(logprobs["meta_info"]["output_top_logprobs"]) == 3
        body = {"text": "stream me", "sampling_params": params, "stream": True}
        with client.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200
            events = [line for line in resp.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) >= 2
        # a value the gateway's types take and the worker refuses: its 400 comes through
        bad = client.post(url, json={"text": "x", "sampling_params": {**params, "top_p": 1.5}})
        assert bad.status_code == 400 and "top_p" in bad.json()["error"]["message"], bad.text


def test_stored_state_goes_on_from_any_worker(dp_server: Server) -> None:
    """A response or conversation one worker stored goes on from the other: the request is
    forwarded to the worker its id names, whose cache holds the turn's prefix (chained turns,
    streamed, GET, input items, DELETE; a conversation's items and responses; an Anthropic
    thread). Through the router a chain goes on whichever worker each turn reaches (before a
    worker is killed below)."""
    import openai

    model = model_name(dp_server)
    on = [
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for url in worker_urls(dp_server)
    ]
    kwargs: Any = dict(model=model, instructions=f"You are agent {uuid.uuid4().hex}.")
    first = on[0].responses.create(**kwargs, input="hello", max_output_tokens=4)
    assert first.id.startswith("resp_w0_")
    chained = on[1].responses.create(
        **kwargs, previous_response_id=first.id, input="again", max_output_tokens=2
    )
    assert chained.id.startswith("resp_w0_")  # the owner answered, and stored it
    assert chained.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 3
    with on[1].responses.stream(
        **kwargs, previous_response_id=chained.id, input="more", max_output_tokens=2
    ) as stream:
        final = final_response(stream)
    assert final.id.startswith("resp_w0_") and final.previous_response_id == chained.id
    assert on[1].responses.retrieve(first.id).id == first.id
    assert len(on[1].responses.input_items.list(final.id).data) >= 4
    on[1].responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        on[0].responses.retrieve(first.id)
    conv = on[1].conversations.create(items=[{"role": "user", "content": "hi"}])
    assert conv.id.startswith("conv_w1_")
    on[0].conversations.items.create(conv.id, items=[{"role": "user", "content": "and"}])
    on[0].responses.create(model=model, conversation=conv.id, input="go", max_output_tokens=1)
    assert len(on[1].conversations.items.list(conv.id).data) == 4  # 3 inputs, 1 output
    client = openai.OpenAI(base_url=f"{dp_server.url}/v1", api_key="unused", max_retries=0)
    previous = None
    for turn in range(4):
        reply = client.responses.create(
            **kwargs, previous_response_id=previous, input=f"turn {turn}", max_output_tokens=2
        )
        previous = reply.id
    # Anthropic's threads likewise: held by the worker that answered, continued from the other
    import anthropic

    claude = [anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0) for url in
              worker_urls(dp_server)]  # fmt: skip
    ask: Any = dict(model=model, system=kwargs["instructions"], max_tokens=2)
    held = claude[1].beta.messages.create(
        **ask, messages=[{"role": "user", "content": "hello"}], thread={"type": "create"}
    )
    assert held.id.startswith("msg_w1_")
    going_on: Any = {"type": "continue", "previous_message_id": held.id}
    again = claude[0].beta.messages.create(
        **ask, messages=[{"role": "user", "content": "again"}], thread=going_on
    )
    assert again.id.startswith("msg_w1_")  # the owner answered, and held it
    assert (again.usage.cache_read_input_tokens or 0) >= held.usage.input_tokens - 3


def test_a_killed_worker_leaves_the_other_serving(dp_server: Server) -> None:
    urls = worker_urls(dp_server)
    victim = httpx.get(f"{urls[1]}/get_server_info", timeout=30).json()["pids"]["http"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "exited with code" not in dp_server.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "worker 1" in dp_server.log() and "the others keep serving" in dp_server.log()
    # the router drops the dead worker at its health checks (the launcher sets them to every
    # 5 s, 2 failures); from then on every request goes to the one left
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        workers = httpx.get(f"{dp_server.url}/workers", timeout=10).json()["workers"]
        if sum(bool(w.get("is_healthy")) for w in workers) == 1:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the router still counts the dead worker healthy: {workers}")
    ok = 0
    with httpx.Client(timeout=60) as client:
        for i in range(8):
            body = {
                "text": f"request {i} after the failure",
                "sampling_params": {"max_new_tokens": 4},
            }
            if client.post(f"{dp_server.url}/generate", json=body).status_code == 200:
                ok += 1
    assert ok == 8
    assert dp_server.proc.poll() is None, "the launcher must keep running"


def test_two_data_parallel_servers_on_one_machine(
    dp_server: Server, api_model_dir: Path, tmp_path: Path
) -> None:
    """The routers' metrics ports are chosen free: a second --dp-size server starts beside the
    first (with the router's fixed default it panicked) and serves, the first still up."""
    args = ["--model", str(api_model_dir), "--dp-size", "2", "--threads-per-worker", "1"]
    args += ["--router", router_of(dp_server)]
    second = start_server([*args, "--max-total-tokens", "4096"], tmp_path / "second.log")
    try:
        out = httpx.post(
            f"{second.url}/v1/completions",
            # the served id: smg routes by it (sglang-router takes any)
            json={"model": model_name(second), "prompt": "def f():", "max_tokens": 2},
            timeout=60,
        )
        assert out.status_code == 200, out.text
        assert dp_server.proc.poll() is None and second.proc.poll() is None
    finally:
        assert stop_server(second, timeout=30) == 0, second.log()[-3000:]


@pytest.mark.parametrize("router", list(ROUTER_PACKAGES))
def test_a_router_that_cannot_start_ends_the_server_with_its_reason(
    router: str, api_model_dir: Path
) -> None:
    import subprocess
    import sys

    pytest.importorskip(ROUTER_PACKAGES[router], reason=f"needs radixserve[router] ({router})")
    cmd = [sys.executable, "-m", "radixserve", "serve", "--model", str(api_model_dir)]
    cmd += ["--dp-size", "2", "--threads-per-worker", "1", "--router", router]
    cmd += ["--router-arg=--no-such-flag"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "the router did not start" in proc.stderr and "--no-such-flag" in proc.stderr
    assert time.monotonic() - started < 120  # the workers' start, then seconds


def test_the_agent_apis_through_the_router(dp_server: Server) -> None:
    """OpenAI's Responses API through either router and Anthropic's Messages through smg,
    each turn sent whole (``store: false``, the Agents SDK's own session memory). The routers
    add SGLang's sampling fields and explicit nulls to what they forward."""
    import anthropic
    import openai

    model = model_name(dp_server)
    client = openai.OpenAI(base_url=f"{dp_server.url}/v1", api_key="unused", max_retries=0)
    first = client.responses.create(model=model, input="hello", max_output_tokens=4, store=False)
    assert first.status in ("completed", "incomplete") and first.usage.output_tokens <= 4
    output = [item.model_dump(exclude_none=True) for item in first.output]
    items: Any = [{"role": "user", "content": "hello"}, *output]
    items.append({"role": "user", "content": "and again"})
    second = client.responses.create(model=model, input=items, max_output_tokens=2, store=False)
    assert second.usage.input_tokens > first.usage.input_tokens
    if router_of(dp_server) != "smg":
        return  # sglang-router routes no /v1/messages (a 404 from the router itself)
    claude = anthropic.Anthropic(base_url=dp_server.url, api_key="unused", max_retries=0)
    msg = claude.messages.create(
        model=model, max_tokens=3, messages=[{"role": "user", "content": "hello"}]
    )
    assert msg.usage.output_tokens <= 3 and msg.stop_reason in ("max_tokens", "end_turn")
