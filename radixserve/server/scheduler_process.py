"""The scheduler process: a :class:`Scheduler` driven by messages from the HTTP process.

Loop: receive (blocking up to ``IDLE_POLL_MS`` when idle, not at all when busy) -> handle each
message -> ``step()`` -> push this iteration's messages to the detokenizer as one list.
Requests arrive validated (the HTTP process's ``RequestValidator``); what only the scheduler
can refuse (``add_request``'s ``ValueError``: a duplicate rid, a request the KV pool can never
hold) becomes a :class:`ReqError` for that rid. An exception in ``step()`` is a bug: the loop
reports it
(:class:`SchedulerFatal`, for the HTTP process's log and its 503s) and the process exits 1.
"""

from __future__ import annotations

import logging
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import zmq

from radixserve.config import EngineConfig
from radixserve.memory_pool.tier_dir import TierUnavailable
from radixserve.radix.tree_summary import HEAD_TOKENS, summarize_tree
from radixserve.runtime.io_struct import GenerateRequest, QueueFull
from radixserve.runtime.pause import Pause
from radixserve.runtime.scheduler import Scheduler
from radixserve.runtime.weight_update import update_weights_from_disk, weights_by_name
from radixserve.server.io_struct import (
    AbortRequest,
    DetokenizeParams,
    FlushCacheReq,
    GetCacheTreeReq,
    GetServerInfoReq,
    GetWeightsReq,
    PauseReq,
    ReqError,
    RpcReply,
    SchedulerFatal,
    SchedulerInfo,
    UpdateLoraReq,
    UpdateWeightsReq,
)
from radixserve.server.ipc import (
    IpcEndpoints,
    ParentWatch,
    exit_process,
    make_socket,
    recv_all,
    setup_child_process,
)
from radixserve.server.kv_event_publisher import KVEventPublisher
from radixserve.tokenizer_loader import load_tokenizer

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
STATS_LOG_INTERVAL_S = 10.0
TIER_SAVE_INTERVAL_S = 5.0  # idle writes of a file tier's index, at most this often
INTEGRITY_WAIT_S = 2.0  # how long /get_server_info waits for an idle moment to check KV


class SchedulerLoop:
    """Owns the scheduler and its two sockets; single-threaded."""

    def __init__(
        self,
        scheduler: Scheduler,
        recv: zmq.Socket,
        send: zmq.Socket,
        watch: ParentWatch,
        events: KVEventPublisher | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.events = events  # the tree's KV events go out once per iteration
        self.recv = recv
        self.send = send
        self.watch = watch
        self.outbox: list[object] = []
        self.pause = Pause()  # /pause_generation: no step until /continue_generation
        self.pending_info: list[tuple[GetServerInfoReq, float]] = []
        self._last_log = time.monotonic()
        self._last_generated = 0
        self._last_tier_save = time.monotonic()
        self._stepped_since_save = False

    def run(self) -> None:
        """Until the parent process is gone."""
        while not self.watch.parent_gone():
            self.run_once(IDLE_POLL_MS)
        logger.warning("the server process is gone; the scheduler exits")

    def run_once(self, idle_timeout_ms: int) -> None:
        timeout = 0 if self.pause.may_step(self.scheduler) else idle_timeout_ms
        msgs = recv_all(self.recv, timeout)
        if not msgs and not self.scheduler.has_work:
            self.scheduler.check_alive()  # idle: a dead tensor-parallel rank still ends us now
            self._maybe_save_tier()
        for msg in msgs:
            self.handle(msg)
        if self.pause.may_step(self.scheduler):
            self.outbox.extend(self.scheduler.step())
            self._stepped_since_save = True
        if self.pending_info:
            self._answer_server_info()
        if self.events is not None:
            self._publish_events()
        self.flush()
        self._maybe_log_stats()

    def flush(self) -> None:
        if self.outbox:
            self.send.send_pyobj(self.outbox)
            self.outbox = []

    def _publish_events(self) -> None:
        events = self.scheduler.kv.take_kv_events()
        if events:
            self.events.publish(events)  # type: ignore[union-attr]

    def handle(self, msg: object) -> None:
        if isinstance(msg, GenerateRequest):
            self._add(msg)
        elif isinstance(msg, AbortRequest):
            self.scheduler.abort_request(msg.rid)
        elif isinstance(msg, FlushCacheReq):
            flushed = self.scheduler.flush_cache()
            logger.info("flush_cache: %s", "done" if flushed else "refused (requests running)")
            self.outbox.append(RpcReply(msg.call_id, flushed))
        elif isinstance(msg, GetServerInfoReq):
            # the integrity check runs between requests: wait (a little) for the scheduler to idle
            wait = INTEGRITY_WAIT_S if msg.check_integrity else 0.0
            self.pending_info.append((msg, time.monotonic() + wait))
        elif isinstance(msg, PauseReq):
            self.outbox.append(self._pause(msg))
        elif isinstance(msg, GetCacheTreeReq):
            self.outbox.append(self._cache_tree(msg))
        elif isinstance(msg, UpdateLoraReq):
            self.outbox.append(self._update_lora(msg))
        elif isinstance(msg, UpdateWeightsReq):
            self.outbox.append(self._update_weights(msg))
        elif isinstance(msg, GetWeightsReq):
            try:
                rows = weights_by_name(self.scheduler, msg.name, msg.truncate_size)
                self.outbox.append(RpcReply(msg.call_id, rows))
            except ValueError as exc:
                self.outbox.append(RpcReply(msg.call_id, None, error=str(exc)))
        else:
            logger.warning("ignoring an unknown message %r", type(msg).__name__)

    def _add(self, req: GenerateRequest) -> None:
        try:
            self.scheduler.add_request(req)
        except QueueFull as exc:
            self.outbox.append(ReqError(req.rid, str(exc), status_code=429))
            return
        except ValueError as exc:
            logger.info("request %s refused: %s", req.rid, exc)
            self.outbox.append(ReqError(req.rid, str(exc)))
            return
        except Exception as exc:  # a bug, but one request must not take the server down
            logger.exception("request %s failed in add_request", req.rid)
            self.outbox.append(ReqError(req.rid, f"internal error: {exc!r}", status_code=500))
            return
        self.outbox.append(DetokenizeParams.of(req))

    def _answer_server_info(self) -> None:
        now, idle = time.monotonic(), not self.scheduler.has_work
        waiting = []
        for msg, deadline in self.pending_info:
            if idle or now >= deadline:
                self.outbox.append(self._server_info(msg))
            else:
                waiting.append((msg, deadline))
        self.pending_info = waiting

    def _server_info(self, msg: GetServerInfoReq) -> RpcReply:
        info: dict[str, Any] = {"stats": self.scheduler.get_stats()}
        info["integrity_ok"], info["integrity_error"] = None, "not checked: requests are running"
        # checked only between requests: that is when "free + cached == capacity" must hold
        if msg.check_integrity and not self.scheduler.has_work:
            try:
                self.scheduler.check_integrity()
                info["integrity_ok"], info["integrity_error"] = True, None
            except AssertionError as exc:
                logger.error("KV integrity check failed: %s", exc)
                info["integrity_ok"], info["integrity_error"] = False, str(exc) or repr(exc)
        return RpcReply(msg.call_id, info)

    def _pause(self, msg: PauseReq) -> RpcReply:
        if msg.mode is None:
            self.pause.resume()
            logger.info("generation continues")
            return RpcReply(msg.call_id, True)
        try:
            self.outbox.extend(self.pause.pause(self.scheduler, msg.mode))
        except ValueError as exc:
            return RpcReply(msg.call_id, False, error=str(exc))
        logger.info("generation paused (%s)", msg.mode)
        return RpcReply(msg.call_id, True)

    def _update_weights(self, msg: UpdateWeightsReq) -> RpcReply:
        try:
            update_weights_from_disk(
                self.scheduler,
                msg.model_path,
                self.outbox.extend,
                msg.flush_cache,
                msg.abort_all_requests,
            )
        except ValueError as exc:
            logger.info("update_weights_from_disk refused: %s", exc)
            return RpcReply(msg.call_id, False, error=str(exc))
        logger.info("weights updated from %s", msg.model_path)
        return RpcReply(msg.call_id, True)

    def _update_lora(self, msg: UpdateLoraReq) -> RpcReply:
        loras = self.scheduler.loras
        try:
            if msg.lora_path is None:
                loras.unload(msg.lora_name)
            else:
                loras.load(msg.lora_name, msg.lora_path, msg.pinned)
        except ValueError as exc:
            return RpcReply(msg.call_id, loras.adapters(), error=str(exc))
        except Exception as exc:  # (out of memory placing it, say): that load fails, not the loop
            logger.exception("loading the LoRA adapter %r failed", msg.lora_name)
            error = f"the LoRA adapter {msg.lora_name!r} could not be loaded: {exc!r}"
            return RpcReply(msg.call_id, loras.adapters(), error=error)
        logger.info(
            "LoRA adapter %r %s", msg.lora_name, "unloaded" if msg.lora_path is None else "loaded"
        )
        return RpcReply(msg.call_id, loras.adapters())

    def _cache_tree(self, msg: GetCacheTreeReq) -> RpcReply:
        try:
            head = None if msg.full_keys else HEAD_TOKENS
            tree = summarize_tree(self.scheduler.kv.tree, msg.max_nodes, head)
        except ValueError as exc:
            return RpcReply(msg.call_id, error=str(exc))
        for node in tree["nodes"]:  # the cache page names each namespace's adapter
            node["adapter"] = self.scheduler.loras.label(node["extra_key"])
        return RpcReply(msg.call_id, {"tree": tree, "stats": self.scheduler.get_stats()})

    def _maybe_save_tier(self) -> None:
        """Idle after work: write a file tier's index (at most every TIER_SAVE_INTERVAL_S), so
        a server that is killed rather than stopped still finds most of its tier."""
        now = time.monotonic()
        if self._stepped_since_save and now - self._last_tier_save >= TIER_SAVE_INTERVAL_S:
            self.scheduler.kv.save_tier()
            self._last_tier_save, self._stepped_since_save = now, False

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_log
        if elapsed < STATS_LOG_INTERVAL_S:
            return
        stats = self.scheduler.get_stats()
        generated = stats["num_generated_tokens"] - self._last_generated
        self._last_log, self._last_generated = now, stats["num_generated_tokens"]
        if generated == 0 and not self.scheduler.has_work:
            return
        logger.info(
            "#running %d  #waiting %d  token usage %.2f  cache hit rate %.2f  "
            "gen throughput %.1f tok/s  #retractions %d  #preemptions %d",
            stats["num_running_reqs"],
            stats["num_waiting_reqs"],
            stats["token_usage"],
            stats["cache_hit_rate"],
            generated / elapsed,
            stats["num_retractions"],
            stats["num_preemptions"],
        )


def run_scheduler_process(
    config: EngineConfig,
    endpoints: IpcEndpoints,
    ready: Connection,
    parent_pid: int,
    log_level: str = "info",
) -> None:
    """Process entry point. Sends a :class:`SchedulerInfo` (or an error string) through
    ``ready`` once the model is loaded, then runs the loop."""
    setup_child_process(log_level)
    try:
        assert config.model_path is not None
        tokenizer = load_tokenizer(config.model_path)
        scheduler = Scheduler(config, tokenizer=tokenizer)
    except TierUnavailable as exc:  # a directory taken or unusable: a line, not a traceback
        ready.send(str(exc))
        exit_process(1)
    except Exception:
        ready.send(f"the scheduler could not load the model:\n{traceback.format_exc()}")
        raise
    events_config = config.kv_events
    publisher = None
    if events_config is not None:
        try:  # a taken port is a startup error, with the reason
            publisher = KVEventPublisher(events_config, config.parallel.dp_rank)
        except ValueError as exc:
            scheduler.shutdown()
            ready.send(str(exc))
            raise
        logger.info("KV events on %s", events_config.endpoint)
    context = zmq.Context()
    recv = make_socket(context, zmq.PULL, endpoints.scheduler_in, bind=True)
    send = make_socket(context, zmq.PUSH, endpoints.detokenizer_in, bind=False)
    info = SchedulerInfo.of(scheduler)
    ready.send(info)
    ready.close()
    logger.info(
        "scheduler ready: %d KV slots, context length %d",
        info.max_total_tokens,
        info.max_context_len,
    )
    loop = SchedulerLoop(scheduler, recv, send, ParentWatch(parent_pid), publisher)
    code = 0
    try:
        loop.run()
        endpoints.remove_dir()  # the parent is gone: nobody else will
    except SystemExit:
        logger.info("scheduler stopping")
    except BaseException:
        message = traceback.format_exc()
        logger.error("the scheduler loop crashed:\n%s", message)
        loop.outbox = [SchedulerFatal(message)]
        loop.flush()
        time.sleep(0.5)  # let the message leave before the process goes
        code = 1
    finally:
        scheduler.shutdown()
        if publisher is not None:
            publisher.shutdown()
    exit_process(code)
