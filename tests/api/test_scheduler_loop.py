"""The scheduler process's loop, in-process over inproc zmq sockets (no subprocess): bad requests
become ReqError, DetokenizeParams precede outputs, aborts, flush and server info RPCs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from radixserve.config import EngineConfig
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.runtime.scheduler import Scheduler
from radixserve.server.detokenizer import Detokenizer
from radixserve.server.io_struct import (
    AbortRequest,
    DetokenizeParams,
    FlushCacheReq,
    GetServerInfoReq,
    ReqError,
    RpcReply,
    TextOutput,
)
from radixserve.server.ipc import ParentWatch, make_socket, recv_all
from radixserve.server.scheduler_process import SchedulerLoop
from radixserve.types import FinishKind, SamplingParams


class Harness:
    def __init__(self, loop: SchedulerLoop, to_loop: zmq.Socket, from_loop: zmq.Socket) -> None:
        self.loop = loop
        self.to_loop = to_loop
        self.from_loop = from_loop

    def send(self, *msgs: object) -> None:
        self.to_loop.send_pyobj(list(msgs))

    def run_until_idle(self, max_iters: int = 500) -> list[object]:
        received: list[object] = []
        for _ in range(max_iters):
            self.loop.run_once(idle_timeout_ms=10)
            received += recv_all(self.from_loop, 0)
            if not self.loop.scheduler.has_work and not self.loop.pending_info:
                break
        return received + recv_all(self.from_loop, 0)


@pytest.fixture(scope="module")
def harness(api_model_dir: Path, tiny_tokenizer: object) -> Iterator[Harness]:
    config = EngineConfig(model_path=str(api_model_dir), max_total_tokens=4096)
    scheduler = Scheduler(config, tokenizer=tiny_tokenizer)
    ctx = zmq.Context()
    pull = make_socket(ctx, zmq.PULL, "inproc://scheduler_in", bind=True)
    to_loop = make_socket(ctx, zmq.PUSH, "inproc://scheduler_in", bind=False)
    from_loop = make_socket(ctx, zmq.PULL, "inproc://detokenizer_in", bind=True)
    push = make_socket(ctx, zmq.PUSH, "inproc://detokenizer_in", bind=False)
    loop = SchedulerLoop(scheduler, pull, push, ParentWatch(os.getppid()))
    yield Harness(loop, to_loop, from_loop)
    scheduler.shutdown()
    ctx.destroy(linger=0)


def request(rid: str, ids: list[int], max_new: int = 4, **params: object) -> GenerateRequest:
    return GenerateRequest(rid, ids, SamplingParams(max_new_tokens=max_new, **params))  # type: ignore[arg-type]


def test_bad_request_becomes_an_error_output(harness: Harness) -> None:
    harness.send(request("too-long", list(range(1, 2000))), request("ok", [1, 2, 3]))
    msgs = harness.run_until_idle()
    errors = [m for m in msgs if isinstance(m, ReqError)]
    assert [e.rid for e in errors] == ["too-long"] and errors[0].status_code == 400
    outs = [m for m in msgs if isinstance(m, ReqOutput) and m.rid == "ok"]
    assert outs[-1].finish_reason is not None and sum(len(o.new_token_ids) for o in outs) >= 1


def test_params_precede_outputs_and_detokenize(harness: Harness, tiny_tokenizer: object) -> None:
    harness.send(request("a", [5, 6, 7], max_new=6, ignore_eos=True, stop=["\x00never"]))
    msgs = harness.run_until_idle()
    kinds = [type(m).__name__ for m in msgs if getattr(m, "rid", None) == "a"]
    assert kinds[0] == "DetokenizeParams" and set(kinds[1:]) == {"ReqOutput"}
    params = msgs[0]
    assert isinstance(params, DetokenizeParams) and params.prompt_tail_ids == [5, 6, 7]
    texts = Detokenizer(tiny_tokenizer).handle(msgs)
    assert all(isinstance(t, TextOutput) for t in texts)
    assert texts[-1].output.completion_tokens == 6  # type: ignore[union-attr]


def test_abort_and_rpcs(harness: Harness) -> None:
    harness.send(request("long", [9, 10], max_new=500, ignore_eos=True))
    harness.loop.run_once(idle_timeout_ms=10)
    harness.send(AbortRequest("long"), FlushCacheReq(7))
    msgs = harness.run_until_idle()
    last = [m for m in msgs if isinstance(m, ReqOutput) and m.rid == "long"][-1]
    assert last.finish_reason is not None and last.finish_reason.kind is FinishKind.ABORT
    assert last.completion_tokens < 500
    harness.send(FlushCacheReq(8), GetServerInfoReq(9))
    replies = {m.call_id: m for m in harness.run_until_idle() if isinstance(m, RpcReply)}
    assert replies[8].value is True
    info = replies[9].value
    assert isinstance(info, dict) and info["integrity_ok"] is True
    assert info["stats"]["num_cached_tokens_in_tree"] == 0
