"""``--grpc-port``: SGLang's gRPC scheduler service (smg's gRPC workers speak it), called with
the stubs of ``smg-grpc-proto`` against a real server; what it generates is what ``/generate``
generates for the same ids."""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from serving_harness import Server, free_port, paused, serving
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

# slow: servers of their own (about 8 s each to start); .ci/run runs them after the default suite
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
PROMPT = list(range(20, 60))


@pytest.fixture(scope="module")
def grpc_server(
    api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, pb_grpc.SglangSchedulerStub]]:
    tmp = tmp_path_factory.mktemp("grpc-server")
    port = free_port()
    events = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "bind": True}
    args = ["--model", str(api_model_dir), "--grpc-port", str(port)]
    args += ["--kv-events-config", json.dumps(events)]
    with serving(args, tmp / "server.log") as srv:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield srv, pb_grpc.SglangSchedulerStub(channel)
        channel.close()


def _request(
    rid: str, ids: list[int], max_new: int = 6, stream: bool = False, **sp: object
) -> pb.GenerateRequest:
    fields: dict[str, object] = dict(temperature=0.0, top_p=1.0, max_new_tokens=max_new)
    fields.update(ignore_eos=True, **sp)
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**fields),  # type: ignore[arg-type]
        stream=stream,
    )


def _http_ids(server: Server, ids: list[int], max_new: int = 6) -> list[int]:
    with server.client() as c:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
        }
        return list(c.post("/generate", json=body).json()["output_ids"])


def test_generate_matches_http(grpc_server: tuple[Server, pb_grpc.SglangSchedulerStub]) -> None:
    server, stub = grpc_server
    want = _http_ids(server, PROMPT)
    (only,) = list(stub.Generate(_request("g1", PROMPT)))
    assert only.WhichOneof("response") == "complete"
    assert list(only.complete.output_ids) == want
    assert only.complete.finish_reason == "length"
    assert only.complete.prompt_tokens == len(PROMPT) and only.complete.completion_tokens == 6
    assert only.complete.cached_tokens == len(PROMPT) - 1  # the HTTP request cached it
    streamed = list(stub.Generate(_request("g2", PROMPT, stream=True)))
    chunks = [r.chunk for r in streamed if r.WhichOneof("response") == "chunk"]
    assert [t for c in chunks for t in c.token_ids] == want
    assert streamed[-1].WhichOneof("response") == "complete"
    assert list(streamed[-1].complete.output_ids) == want


def test_n_samples_logprobs_and_stop_token(
    grpc_server: tuple[Server, pb_grpc.SglangSchedulerStub],
) -> None:
    server, stub = grpc_server
    want = _http_ids(server, PROMPT)
    request = _request("n2", PROMPT, n=2)
    request.return_logprob, request.top_logprobs_num = True, 2
    completes = [r.complete for r in stub.Generate(request)]
    assert sorted(c.index for c in completes) == [0, 1]
    for c in completes:
        assert list(c.output_ids) == want  # greedy: both samples alike
        assert list(c.output_logprobs.token_ids) == want
        assert len(c.output_logprobs.token_logprobs) == 6
        assert all(len(t.values) == 2 for t in c.output_logprobs.top_logprobs)
    stop = pb.SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=[want[2]])
    request = pb.GenerateRequest(
        request_id="st", tokenized=pb.TokenizedInput(input_ids=PROMPT), sampling_params=stop
    )
    (done,) = [r.complete for r in stub.Generate(request)]
    assert done.finish_reason == "stop" and done.matched_token_id == want[2]
    assert list(done.output_ids) == want[:3]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_request("b1", []), "input_ids"),
        (_request("b2", PROMPT, temperature=-1.0), "temperature"),
        (_request("b3", [5] * 5000), "context"),
        (
            pb.GenerateRequest(
                request_id="b4", tokenized=pb.TokenizedInput(input_ids=PROMPT), lora_id="nope"
            ),
            "nope",
        ),
    ],
)
def test_bad_requests_are_invalid_argument(
    grpc_server: tuple[Server, pb_grpc.SglangSchedulerStub],
    request_: pb.GenerateRequest,
    message: str,
) -> None:
    _, stub = grpc_server
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request_))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_abort_ends_a_request(grpc_server: tuple[Server, pb_grpc.SglangSchedulerStub]) -> None:
    """Held queued by an in-place pause (over HTTP), so the abort reaches it before its end
    however busy the machine; it ends the stream with "abort" when the steps resume."""
    server, stub = grpc_server
    got: list[pb.GenerateResponse] = []

    def read() -> None:
        for response in stub.Generate(_request("long", PROMPT, max_new=900, stream=True)):
            got.append(response)

    with server.client() as http, ThreadPoolExecutor(1) as pool:
        with paused(http):
            # the reader's error (the stream failing instead of ending) surfaces via .result()
            reading = pool.submit(read)
            while http.get("/get_server_info").json()["scheduler"]["num_waiting_reqs"] != 1:
                assert not reading.done(), reading.result()
            assert stub.Abort(pb.AbortRequest(request_id="long")).success
        reading.result(timeout=60)
    assert got[-1].WhichOneof("response") == "complete"
    assert got[-1].complete.finish_reason == "abort"
    assert got[-1].complete.completion_tokens == 0


def test_info_loads_flush_and_tokenizer(
    grpc_server: tuple[Server, pb_grpc.SglangSchedulerStub], api_model_dir: Path
) -> None:
    _, stub = grpc_server
    assert stub.HealthCheck(pb.HealthCheckRequest()).healthy
    model = stub.GetModelInfo(pb.GetModelInfoRequest())
    assert model.model_path == str(api_model_dir) and model.is_generation
    assert model.weight_version == "default"
    assert model.max_context_length == 1024 and list(model.architectures) == ["LlamaForCausalLM"]
    info = stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.server_type == "grpc" and info.max_total_num_tokens > 0
    assert "cache_hit_rate" in info.scheduler_info.fields
    loads = stub.GetLoads(pb.GetLoadsRequest())
    assert loads.loads[0].max_total_num_tokens == info.max_total_num_tokens
    assert stub.FlushCache(common_pb2.FlushCacheRequest()).success
    chunks = list(stub.GetTokenizer(common_pb2.GetTokenizerRequest()))
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "tokenizer.json" in names and "tokenizer_config.json" in names


def test_kv_events_stream_what_a_request_stores(
    grpc_server: tuple[Server, pb_grpc.SglangSchedulerStub],
) -> None:
    _, stub = grpc_server
    assert stub.FlushCache(common_pb2.FlushCacheRequest()).success
    batches: list[common_pb2.KvEventBatch] = []
    events = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())

    def read() -> grpc.StatusCode | None:
        """How the stream ended: the status it failed with, None if it ended on its own."""
        try:
            for batch in events:
                batches.append(batch)
        except grpc.RpcError as exc:
            return exc.code()
        return None

    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read)
        try:
            time.sleep(0.5)  # the relay's SUB joined
            prompt = list(range(300, 340))
            list(stub.Generate(_request("ev", prompt, max_new=2)))
            deadline = time.monotonic() + 10
            stored: list[int] = []
            while time.monotonic() < deadline and stored[: len(prompt) - 1] != prompt[:-1]:
                time.sleep(0.05)
                stored = [
                    t
                    for b in list(batches)
                    for e in b.events
                    if e.WhichOneof("data") == "stored"
                    for block in e.stored.blocks
                    for t in block.token_ids
                ]
        finally:
            events.cancel()
        # a subscription runs until its client cancels it: it ends no other way
        assert reading.result(timeout=10) == grpc.StatusCode.CANCELLED
    assert stored[: len(prompt) - 1] == prompt[:-1]  # the prompt's pages, in order
    seqs = [b.sequence_number for b in batches]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.slow  # a server of its own for one answer (about 8 s)
def test_without_kv_events_subscribe_is_unimplemented(api_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    with serving(["--model", str(api_model_dir), "--grpc-port", str(port)], tmp_path / "s.log"):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb_grpc.SglangSchedulerStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest()))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
