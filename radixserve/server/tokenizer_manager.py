"""TokenizerManager: the HTTP process's side of the server (docs/design.md, "One request,
end to end", step 1).

It tokenizes (``prompts``) and validates (``validator``) requests (``ValueError``: HTTP 400),
sends them to the scheduler and awaits their outputs per ``rid``: one asyncio reader task takes
the detokenizer's messages off a zmq socket and puts each into its request's queue. Leaving a request's ``stream`` context
before its last output (client disconnect, error, cancellation) aborts it in the scheduler.

If a child process dies (or the scheduler reports a crash), every pending and later request
fails with :class:`SchedulerUnavailable` (HTTP 503), and the log says why; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import zmq
import zmq.asyncio

from radixserve.config import ServerConfig
from radixserve.hub import resolve_model
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.lora_manager import check_adapter
from radixserve.server.io_struct import (
    AbortRequest,
    ControlReq,
    FlushCacheReq,
    GetCacheTreeReq,
    GetServerInfoReq,
    GetWeightsReq,
    PauseReq,
    ReqError,
    RpcReply,
    SchedulerFatal,
    SchedulerInfo,
    TextOutput,
    UpdateLoraReq,
    UpdateWeightsReq,
)
from radixserve.server.ipc import IpcEndpoints, make_socket
from radixserve.server.prompt_tokenizer import PromptTokenizer
from radixserve.server.request_state import (
    ClientDisconnected,
    OutputObserver,
    Process,
    ReqState,
    RequestFailed,
    SchedulerUnavailable,
)
from radixserve.server.request_validation import RequestValidator
from radixserve.server.rid_scope import client_rid, scope_of

logger = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.5
WATCH_INTERVAL_S = 0.25
RPC_TIMEOUT_S = 30.0
WEIGHT_UPDATE_TIMEOUT_S = 1800.0  # reading a large checkpoint from a slow disk
DRAIN_SETTLE_S = 2.0  # after ending the last requests: time for their responses to close


class TokenizerManager:
    """Lives in the HTTP process, on its event loop: every method runs on that loop's thread.

    ``states`` holds the requests that have a waiting client; outputs of any other rid (its
    client left) are dropped. ``info`` is the scheduler's ready handshake (context length,
    vocabulary size). ``children`` are watched: one that exits fails everything with 503.
    """

    def __init__(
        self,
        config: ServerConfig,
        endpoints: IpcEndpoints,
        info: SchedulerInfo,
        tokenizer: Any = None,
        children: Mapping[str, Process] | None = None,
        observer: OutputObserver | None = None,
    ) -> None:
        assert config.engine.model_path is not None
        self.config = config
        self.info = info
        allow_special = config.allow_special_tokens_in_content
        self.prompts = (
            PromptTokenizer(tokenizer, info.max_context_len, allow_special)
            if tokenizer is not None
            else PromptTokenizer.from_pretrained(
                config.engine.model_path, info.max_context_len, allow_special
            )
        )
        if config.chat_template is not None:  # --chat-template: the deployment's own
            self.prompts.tokenizer.chat_template = config.chat_template
        self.validator = RequestValidator(
            info,
            config.default_max_new_tokens,
            len(self.prompts.tokenizer),
            auto_truncate=config.allow_auto_truncate,
        )
        self.children = dict(children or {})
        self.observer = observer
        self.states: dict[str, ReqState] = {}
        # the LoRA adapters served (name -> directory), as the scheduler last reported them
        self.lora_adapters: dict[str, str] = dict(config.engine.lora.lora_paths)
        self.model_path: str = config.engine.model_path  # whose weights it serves now
        self.weight_version = config.weight_version  # SGLang's label of them
        self.dead_reason: str | None = None
        self._rpcs: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._endpoints = endpoints
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False  # the sockets are closed: nothing more is sent
        self._draining = False  # shutting down: no new requests
        # sends are never blocking (no high-water mark): a plain socket, usable in ``finally``
        self._send = make_socket(zmq.Context.instance(), zmq.PUSH, endpoints.scheduler_in, False)
        self._actx = zmq.asyncio.Context()
        self._recv = make_socket(self._actx, zmq.PULL, endpoints.tokenizer_in, bind=True)

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._read_loop(), name="radixserve-output-reader"),
            asyncio.create_task(self._watch_children(), name="radixserve-child-watch"),
        ]

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._recv.close(linger=0)
        self._send.close(linger=0)
        self._actx.term()

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None

    def child_pids(self) -> dict[str, int | None]:
        return {name: proc.pid for name, proc in self.children.items()}

    @staticmethod
    def new_rid() -> str:
        return uuid.uuid4().hex

    # ---- requests ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def stream(
        self,
        requests: list[GenerateRequest],
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> AsyncIterator[AsyncIterator[tuple[int, TextOutput]]]:
        """Send ``requests`` (one HTTP request's batch or choices, validated by the caller) as
        one message and yield one iterator of ``(index, output)`` over all of them, ending
        after the last output of the last one. However many requests, the group has one queue
        and one waiter, and the client is polled once per ``DISCONNECT_POLL_S``. Leaving the
        context early aborts the unfinished ones (one message).

        Raises :class:`SchedulerUnavailable`, :class:`RequestFailed`, ``ValueError`` (a
        duplicate rid) and :class:`ClientDisconnected` (``is_disconnected`` said so)."""
        self._check_alive()
        rids = [r.rid for r in requests]
        running = next((rid for rid in rids if rid in self.states), None)
        if running is not None:
            raise ValueError(f"a request with rid {client_rid(running)!r} is already running")
        if len(set(rids)) != len(rids):
            raise ValueError("the rids of a batch must be distinct")
        self.validator.check_group(len(requests))
        queue: asyncio.Queue[tuple[int, TextOutput | Exception]] = asyncio.Queue()
        states = [ReqState(r, i, queue) for i, r in enumerate(requests)]
        self.states.update((s.request.rid, s) for s in states)
        self._send.send_pyobj(list(requests))
        try:
            yield self._outputs(states, queue, is_disconnected)
        finally:
            for state in states:
                self.states.pop(state.request.rid, None)
            aborts = [AbortRequest(s.request.rid) for s in states if not s.finished]
            if aborts and self.is_alive and not self._closed:
                self._send.send_pyobj(aborts)

    async def _outputs(
        self,
        states: list[ReqState],
        queue: asyncio.Queue[tuple[int, TextOutput | Exception]],
        is_disconnected: Callable[[], Awaitable[bool]] | None,
    ) -> AsyncIterator[tuple[int, TextOutput]]:
        # the client is checked every DISCONNECT_POLL_S, whether or not outputs keep coming
        next_check = time.monotonic() + DISCONNECT_POLL_S
        num_unfinished = len(states)
        while num_unfinished:
            if is_disconnected is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + DISCONNECT_POLL_S
                if await is_disconnected():
                    logger.info("client of %s disconnected: aborting it", states[0].request.rid)
                    raise ClientDisconnected()
            if queue.empty():
                try:
                    i, item = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    continue
            else:
                i, item = queue.get_nowait()
            state = states[i]
            if isinstance(item, Exception):
                raise item
            if item.output.finish_reason is not None and not state.finished:
                state.finished = True
                num_unfinished -= 1
            yield i, item

    def abort(self, rid: str | None = None) -> list[str]:
        """Abort one request, or every pending one (``rid`` None); returns the rids aborted."""
        return self.abort_where(lambda r: rid is None or r == rid)

    def num_pending(self, scope: str | None) -> int:
        """Requests of rid scope ``scope`` (a tenant: ``server/rid_scope.py``) waiting here."""
        return sum(scope_of(rid) == scope for rid in self.states)

    def abort_where(self, match: Callable[[str], bool]) -> list[str]:
        """Abort every pending request whose (scheduler) rid ``match`` takes; their rids."""
        rids = [r for r in self.states if match(r)]
        if rids and self.is_alive and not self._closed:
            self._send.send_pyobj([AbortRequest(r) for r in rids])
        return rids

    async def flush_cache(self) -> bool:
        return bool(await self._rpc(FlushCacheReq(next(self._call_ids))))

    async def update_lora(
        self, lora_name: str, lora_path: str | None, pinned: bool = False
    ) -> dict[str, str]:
        """Load (``lora_path``) or unload (``None``) an adapter in the scheduler; the adapters
        served afterwards. ``ValueError``: the reason it did not. The adapter's files are read
        and checked here first, in a worker thread (this loop serves on meanwhile), so a
        malformed adapter never reaches the scheduler's loop."""
        if lora_path is not None:
            await asyncio.to_thread(check_adapter, lora_path, self.config.engine)
        msg = UpdateLoraReq(next(self._call_ids), lora_name, lora_path, pinned)
        self.lora_adapters = dict(await self._rpc(msg))
        return self.lora_adapters

    async def pause_generation(self, mode: str | None) -> None:
        """Stop the scheduler's steps in ``mode`` (one of ``runtime/pause.py``'s, checked by the
        caller), or with None let them go on."""
        await self._rpc(PauseReq(next(self._call_ids), mode))

    async def update_weights_from_disk(
        self,
        model_path: str,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        weight_version: str | None = None,
    ) -> None:
        """The scheduler's model from the checkpoint ``model_path`` (a directory, or a hub id
        fetched here in a worker thread): ``runtime/weight_update.py``; then ``model_path`` names
        it, and ``weight_version`` (if given) labels it. ``ValueError``: why not, the weights
        unchanged. Waits as long as loading takes (``WEIGHT_UPDATE_TIMEOUT_S``)."""
        path = await asyncio.to_thread(resolve_model, model_path)
        msg = UpdateWeightsReq(next(self._call_ids), path, flush_cache, abort_all_requests)
        await self._rpc(msg, WEIGHT_UPDATE_TIMEOUT_S)
        self.model_path = path
        if weight_version is not None:
            self.weight_version = weight_version

    async def get_weights_by_name(self, name: str, truncate_size: int) -> list[Any]:
        """``runtime/weight_update.py``'s ``weights_by_name`` in the scheduler; ``ValueError``."""
        return list(await self._rpc(GetWeightsReq(next(self._call_ids), name, truncate_size)))

    async def get_server_info(self, check_integrity: bool = True) -> dict[str, Any]:
        reply = await self._rpc(GetServerInfoReq(next(self._call_ids), check_integrity))
        return dict(reply)

    async def get_cache_tree(self, max_nodes: int, full_keys: bool = False) -> dict[str, Any]:
        """The radix tree summarised to ``max_nodes`` nodes, and the scheduler's stats."""
        msg = GetCacheTreeReq(next(self._call_ids), max_nodes, full_keys)
        return dict(await self._rpc(msg))

    async def _rpc(self, msg: ControlReq, timeout: float = RPC_TIMEOUT_S) -> Any:
        """The scheduler's answer to ``msg``: ``ValueError`` where it refused (with why),
        :class:`SchedulerUnavailable` where it is gone or did not answer within ``timeout``."""
        self._check_alive()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._rpcs[msg.call_id] = future
        self._send.send_pyobj([msg])
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise SchedulerUnavailable(
                f"the scheduler did not answer within {timeout:.0f} s"
            ) from None
        finally:
            self._rpcs.pop(msg.call_id, None)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise SchedulerUnavailable(self.dead_reason)
        if self._closed or self._draining:
            raise SchedulerUnavailable("the server is shutting down")

    # ---- background tasks -------------------------------------------------------------------
    async def _read_loop(self) -> None:
        while True:
            msgs = await self._recv.recv_pyobj()
            now = time.monotonic()
            for msg in msgs:
                try:
                    self._dispatch(msg, now)
                except Exception:  # one bad message must not stop every request
                    logger.exception("dropping a message the server could not dispatch")

    def _dispatch(self, msg: object, now: float) -> None:
        if isinstance(msg, TextOutput):
            state = self.states.get(msg.output.rid)
            if state is None:
                return  # its client is gone
            if self.observer is not None:
                self.observer.on_output(state, msg, now)
            if state.first_output_time is None:
                state.first_output_time = now
            state.last_output_time = now
            state.queue.put_nowait((state.index, msg))
        elif isinstance(msg, ReqError):
            state = self.states.get(msg.rid)
            if state is not None:
                state.queue.put_nowait((state.index, RequestFailed(msg.message, msg.status_code)))
        elif isinstance(msg, RpcReply):
            future = self._rpcs.get(msg.call_id)
            if future is not None and not future.done():
                if msg.error is None:
                    future.set_result(msg.value)
                else:  # the scheduler refused the call: bad input, a 400 to the HTTP caller
                    future.set_exception(ValueError(msg.error))
        elif isinstance(msg, SchedulerFatal):
            self._fail_all(f"the scheduler crashed:\n{msg.message}")
        else:
            logger.warning("ignoring an unknown message %r", type(msg).__name__)

    async def _watch_children(self) -> None:
        while self.dead_reason is None:
            for name, proc in self.children.items():
                if proc.exitcode is not None:
                    self._fail_all(f"the {name} process exited with code {proc.exitcode}")
                    break
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _fail_all(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        logger.error("%s; every request now fails with 503", reason)
        self._end_pending(reason)

    def _end_pending(self, reason: str) -> None:
        for state in self.states.values():
            state.queue.put_nowait((state.index, SchedulerUnavailable(reason)))
        for future in self._rpcs.values():
            if not future.done():
                future.set_exception(SchedulerUnavailable(reason))

    async def drain(self, timeout_s: float) -> None:
        """Shutting down: new requests get 503 at once; pending ones may finish for
        ``timeout_s``, then the rest end with :class:`SchedulerUnavailable` (a stream with an
        error event and ``[DONE]``, a plain request with a 503) and are aborted."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while self.states and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.states:
            logger.warning(
                "shutting down: ending %d requests still running after %.1f s",
                len(self.states),
                timeout_s,
            )
            self._end_pending("the server is shutting down")
        deadline = time.monotonic() + DRAIN_SETTLE_S
        while self.states and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
