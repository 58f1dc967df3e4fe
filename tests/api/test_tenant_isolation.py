"""What one tenant can do to or learn of another on a keyed server: its aborts reach its own
requests only, its rids are its own, its counters are its own; and the bounds on what one
request may carry, on every door."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from keyed_harness import KeyedServer, bearer
from serving_harness import paused
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from radixserve.server.request_validation import (
    MAX_LOGIT_BIAS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_TEXT_CHARS,
)

pytestmark = pytest.mark.timeout(240)
SHORT = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def generate(url: str, who: str, **body: Any) -> httpx.Response:
    body.setdefault("sampling_params", {"max_new_tokens": 1})
    return httpx.post(
        f"{url}/generate", json={"text": "hi", **body}, headers=bearer(who), timeout=120
    )


def pending(url: str, who: str) -> int:
    info = httpx.get(f"{url}/get_server_info", headers=bearer(who), timeout=30).json()
    return int(info["scheduler"]["num_pending_reqs"])


def wait_pending(url: str, who: str) -> None:
    """Until ``who``'s one request is pending (held: the scheduler is paused)."""
    deadline = time.monotonic() + 60
    while pending(url, who) != 1:
        assert time.monotonic() < deadline, f"{who} never had its request pending"
        time.sleep(0.05)


@contextlib.contextmanager
def paused_by_admin(url: str) -> Iterator[None]:
    """The scheduler paused in place by the admin (``serving_harness.paused``): requests sent
    meanwhile wait, so each is still pending when the abort comes, on a machine however busy."""
    with httpx.Client(base_url=url, headers=bearer("admin"), timeout=30) as admin, paused(admin):
        yield


def test_a_tenants_abort_reaches_its_own_requests_only(keyed_server: KeyedServer) -> None:
    """b's abort reaches b's request of a rid a runs too, not a's."""
    url, rid = keyed_server.url, "job-shared-rid"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with paused_by_admin(url):
            # two tenants may run a request of the same rid at once
            mine = pool.submit(generate, url, "a", rid=rid, sampling_params=SHORT)
            theirs = pool.submit(generate, url, "b", rid=rid, sampling_params=SHORT)
            wait_pending(url, "a")
            wait_pending(url, "b")
            again = generate(url, "b", rid=rid)  # b's own rid, running: refused, to b alone
            aborted = httpx.post(f"{url}/abort_request", json={"rid": rid}, headers=bearer("b"))
            everyone = httpx.post(
                f"{url}/abort_request", json={"abort_all": True}, headers=bearer("b"), timeout=30
            )
        assert theirs.result().json()["meta_info"]["finish_reason"]["type"] == "abort"
        # a's request of the same rid runs to its end, untouched by b's abort
        assert mine.result().json()["meta_info"]["finish_reason"]["type"] == "length"
    assert again.status_code == 400 and "already running" in again.text
    assert aborted.json() == {"aborted": [rid]}
    assert everyone.status_code == 403  # abort_all is the admin's


def test_the_admins_abort_all_reaches_every_tenant(keyed_server: KeyedServer) -> None:
    url, rid = keyed_server.url, "job-of-a"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with paused_by_admin(url):
            mine = pool.submit(generate, url, "a", rid=rid, sampling_params=SHORT)
            wait_pending(url, "a")
            admin = httpx.post(
                f"{url}/abort_request", json={"abort_all": True}, headers=bearer("admin")
            )
        assert mine.result().json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert admin.json() == {"aborted": [rid]}


def test_each_tenant_sees_its_own_counters(keyed_server: KeyedServer) -> None:
    url = keyed_server.url

    def prompt_tokens(who: str) -> float:
        text = httpx.get(f"{url}/metrics", headers=bearer(who), timeout=30).text
        line = next(x for x in text.splitlines() if x.startswith("radixserve:prompt_tokens_total"))
        return float(line.rsplit(" ", 1)[1])

    def info(who: str) -> dict[str, Any]:
        return httpx.get(f"{url}/get_server_info", headers=bearer(who), timeout=30).json()

    before = {who: prompt_tokens(who) for who in ("a", "b", "admin")}
    a_tokens = generate(url, "a", text="one prompt of tenant a")
    b_tokens = [generate(url, "b", text=f"tenant b, prompt {i}") for i in range(2)]
    a_sent = a_tokens.json()["meta_info"]["prompt_tokens"]
    b_sent = sum(r.json()["meta_info"]["prompt_tokens"] for r in b_tokens)
    assert prompt_tokens("a") - before["a"] == a_sent
    assert prompt_tokens("b") - before["b"] == b_sent
    assert prompt_tokens("admin") - before["admin"] == a_sent + b_sent
    mine = info("a")
    assert "num_running_reqs" not in mine["scheduler"] and "pids" not in mine
    assert mine["scheduler"]["num_finished_reqs"] >= 1
    assert "num_running_reqs" in info("admin")["scheduler"]
    text = httpx.get(f"{url}/metrics", headers=bearer("a"), timeout=30).text
    assert "radixserve:num_running_reqs" not in text and "cache_hit_rate" not in text


def test_what_a_request_carries_is_bounded(keyed_server: KeyedServer) -> None:
    url = keyed_server.url
    one = generate(url, "a", sampling_params={"stop": "x" * (MAX_STOP_STRING_CHARS + 1)})
    assert one.status_code == 400 and "a stop string holds" in one.text
    many = ["x" * MAX_STOP_STRING_CHARS] * (MAX_STOP_TEXT_CHARS // MAX_STOP_STRING_CHARS + 1)
    stop = generate(url, "a", sampling_params={"stop": many})
    assert stop.status_code == 400 and "stop strings hold" in stop.text
    bias = {str(i): 1.0 for i in range(MAX_LOGIT_BIAS + 1)}
    assert generate(url, "a", sampling_params={"logit_bias": bias}).status_code == 400
    past = {str(keyed_server.num_text_tokens + 1): 5.0}  # a padding row of the model
    resp = generate(url, "a", sampling_params={"logit_bias": past})
    assert resp.status_code == 400 and "tokenizer" in resp.text
    body = {"prompt": "hi", "max_tokens": 1, "n": 10}  # the queue holds 4: it never could
    many = httpx.post(f"{url}/v1/completions", json=body, headers=bearer("a"), timeout=30)
    assert many.status_code == 400 and "--max-queued-requests" in many.text
    assert "retry-after" not in many.headers


def test_the_grpc_door_has_the_http_bounds(keyed_server: KeyedServer) -> None:
    metadata = [("authorization", "Bearer " + "tenant-a-key-7f3a")]

    def refused(**params: Any) -> grpc.StatusCode:
        request = pb.GenerateRequest(
            request_id="bounded",
            tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]),
            sampling_params=pb.SamplingParams(max_new_tokens=1, **params),
        )
        with keyed_server.channel() as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Generate(request, metadata=metadata, timeout=30))
        return caught.value.code()  # type: ignore[no-any-return]

    assert refused(n=2000) == grpc.StatusCode.INVALID_ARGUMENT  # past --max-batch-sub-requests
    assert refused(n=10) == grpc.StatusCode.INVALID_ARGUMENT  # past --max-queued-requests
    long_stop = ["y" * (MAX_STOP_STRING_CHARS + 1)]
    assert refused(stop=long_stop) == grpc.StatusCode.INVALID_ARGUMENT


def test_the_grpc_door_keeps_each_tenants_cache(keyed_server: KeyedServer) -> None:
    prompt = list(range(400, 460))

    def cached(who: str) -> int:
        request = pb.GenerateRequest(
            tokenized=pb.TokenizedInput(input_ids=prompt),
            sampling_params=pb.SamplingParams(max_new_tokens=1),
        )
        metadata = [("authorization", bearer(who)["Authorization"])]
        with keyed_server.channel() as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            out = list(stub.Generate(request, metadata=metadata, timeout=60))
        return int(out[-1].complete.cached_tokens)

    cached("a")
    assert cached("a") > 0
    assert cached("b") == 0  # a's prompt is not b's cache


def test_a_body_cut_off_is_never_run(keyed_server: KeyedServer) -> None:
    """A client that leaves mid-body: what it sent parses as JSON, and still does not run."""
    import socket
    from urllib.parse import urlsplit

    url = keyed_server.url
    before = httpx.get(f"{url}/get_server_info", headers=bearer("b")).json()["scheduler"]
    body = b'{"text": "a cut-off request", "sampling_params": {"max_new_tokens": 1}}'
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        head = (
            f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: {bearer('b')['Authorization']}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(body) + 100}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
        time.sleep(0.5)
    generate(url, "b")  # one request that runs, after it: the cut one would be counted first
    after = httpx.get(f"{url}/get_server_info", headers=bearer("b")).json()["scheduler"]
    assert after["num_finished_reqs"] == before["num_finished_reqs"] + 1


def test_every_door_refuses_the_same_over_limit_request_alike(keyed_server: KeyedServer) -> None:
    """One request builder for every door: the same bound, the same words, on /generate, both
    OpenAI routes and gRPC."""
    url, stop = keyed_server.url, ["s" * (MAX_STOP_STRING_CHARS + 1)]
    messages = [{"role": "user", "content": "hi"}]
    http = {
        "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 1, "stop": stop}},
        "/v1/completions": {"prompt": "hi", "max_tokens": 1, "stop": stop},
        "/v1/chat/completions": {"messages": messages, "max_tokens": 1, "stop": stop},
    }
    said = set()
    for path, body in http.items():
        resp = httpx.post(url + path, json=body, headers=bearer("a"), timeout=30)
        assert resp.status_code == 400, (path, resp.text)
        said.add(resp.json()["error"]["message"])
    request = pb.GenerateRequest(
        tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]),
        sampling_params=pb.SamplingParams(max_new_tokens=1, stop=stop),
    )
    with keyed_server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        metadata = [("authorization", bearer("a")["Authorization"])]
        list(pb_grpc.SglangSchedulerStub(channel).Generate(request, metadata=metadata))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    said.add(caught.value.details())
    assert len(said) == 1, said
