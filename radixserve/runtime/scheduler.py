"""Scheduler: continuous batching whose every decision is cache-aware.

One step reads like the data flow::

    aborts -> pick the next batch (prefill if admission allows, else decode) -> run it
           -> process results (append tokens, stop, cache, free)

With overlap scheduling (docs/design.md, "Overlap scheduling") the forward of batch N runs in the
model worker's thread while this thread prepares batch N+1 and then processes N's results
(``overlap_step`` beside ``normal_step``). A request finished in N may still sit in N+1: its token
there is dropped and its KV is released once N+1 is done, never twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from radixserve.config import EngineConfig
from radixserve.policy import PrefillAdder, PrefillPlan, SchedulePolicy
from radixserve.runtime.grammar import GrammarFactory
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.lora_manager import LoraManager
from radixserve.runtime.mixed_chunk import carry_running
from radixserve.runtime.model_worker import BatchResult, Worker
from radixserve.runtime.output_processor import advance, make_output
from radixserve.runtime.overlap_wait import must_wait
from radixserve.runtime.request_limits import RequestLimits
from radixserve.runtime.retraction import NewTokenRatio, need, retract
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.runtime.scheduler_stats import SchedulerStats
from radixserve.runtime.spec_decode import SpecDecoder, verify_lens
from radixserve.runtime.worker_builder import build_model_worker
from radixserve.types import FinishKind, FinishReason, Req

logger = logging.getLogger(__name__)


class Scheduler:
    """``Scheduler(config, tokenizer)`` loads the model; tests may pass their own ``kv`` (a
    :class:`KVManager`) and ``worker`` (anything that runs a batch, e.g. a fake model).

    ``clock``: the one time source of the scheduling code (a request's ``arrival_time``, the
    stats' uptime); ``time.monotonic`` by default, a virtual clock in the simulator
    (``radixserve.sim``). Policies order by arrival and age by passes, never by reading time.
    """

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: Any | None = None,
        *,
        kv: KVManager | None = None,
        worker: Worker | None = None,
        clock: Callable[[], float] = time.monotonic,
        loras: LoraManager | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.constants = config.admission.constants
        self.tokenizer = tokenizer
        if worker is None:
            kv, worker = build_model_worker(config, kv)
            loras = loras or LoraManager.of(config, worker.runner.load_lora)
        if kv is None:
            raise ValueError("a Scheduler given a worker needs its kv too")
        self.kv = kv
        self.worker = worker
        self.device = worker.device
        self.max_context_len = self.kv.max_context_len
        self.eos_token_ids = worker.eos_token_ids
        self.limits = RequestLimits(
            self.max_context_len,
            kv.capacity - config.page_size - self.constants.ignore_eos_reserve_tokens,
            config.admission.max_queued_requests,
        )
        self.admission = config.admission
        self.policy = SchedulePolicy.from_engine_config(config, self.kv.tree)
        self.waiting: list[Req] = []
        self.running = ScheduleBatch([])
        self.chunked_req: Req | None = None
        self.reqs: dict[str, Req] = {}  # every unfinished request, by rid
        self.in_flight: tuple[ScheduleBatch, Future[BatchResult]] | None = None
        self.pending_aborts: set[str] = set()
        self.pending_outputs: list[ReqOutput] = []
        self.new_token_ratio = NewTokenRatio(self.constants)
        self.stats = SchedulerStats(clock=clock)
        runner = getattr(worker, "runner", None)  # the cost model measures its steps
        self.spec = SpecDecoder.of(config, self.kv, self.max_context_len, self.stats, runner)
        self.grammars = GrammarFactory(tokenizer, worker.vocab_size, self.eos_token_ids)
        self.enable_jump_forward = not config.disable_jump_forward
        self.swap = config.admission.preemption_mode == "swap"  # sent-back KV goes to the tier
        self.loras = loras or LoraManager.of(config, None)

    # ---- requests in -----------------------------------------------------------------------
    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request validated at the edge (``server/request_validation.py``). Raises
        ``ValueError`` for what only the scheduler can see: a duplicate rid, a full queue
        (``QueueFull``), a request that the KV pool can never hold."""
        if request.rid in self.reqs:
            raise ValueError(f"a request with rid {request.rid!r} is already running")
        self.limits.check(request, len(self.waiting))
        grammar = self.grammars.for_request(request)
        lora_id, namespace = self.loras.acquire(request.lora_name, request.extra_key)
        req = request.to_req(self.clock(), self.eos_token_ids, grammar, lora_id, namespace)
        req.arrival_processed_tokens = self.stats.num_prefill_tokens  # HRRN's clock
        self.reqs[req.rid] = req
        self.waiting.append(req)

    def abort_request(self, rid: str) -> None:
        if rid in self.reqs:
            self.pending_aborts.add(rid)

    @property
    def has_work(self) -> bool:
        work = (self.waiting, self.running, self.chunked_req, self.in_flight, self.pending_outputs)
        return any(work)

    # ---- the loop ------------------------------------------------------------------------
    def step(self) -> list[ReqOutput]:
        """One iteration: ``overlap_step`` or ``normal_step``; outputs of updated requests."""
        outputs = self.overlap_step() if self.worker.overlap else self.normal_step()
        if not self.has_work:
            self.new_token_ratio = NewTokenRatio(self.constants)
        return outputs

    def normal_step(self) -> list[ReqOutput]:
        batch = self.get_next_batch()
        if batch is not None:
            self.process_result(batch, self.worker.run(batch))
        return self.take_outputs()

    def overlap_step(self) -> list[ReqOutput]:
        batch = self.get_next_batch()
        last, self.in_flight = self.in_flight, None
        if batch is not None:
            self.in_flight = (batch, self.worker.submit(batch))
            self.stats.num_overlapped_batches += last is not None
        if last is not None:
            self.process_result(last[0], last[1].result())
        return self.take_outputs()

    def sync(self) -> None:
        """Wait for the batch in flight and process it (before freeing KV of running requests)."""
        if self.in_flight is not None:
            batch, future = self.in_flight
            self.in_flight = None
            self.process_result(batch, future.result())

    # ---- choosing the next batch -------------------------------------------------------------
    def get_next_batch(self) -> ScheduleBatch | None:
        self._apply_aborts()
        if self.in_flight is not None and must_wait(
            self.in_flight[0],
            waiting=bool(self.waiting),
            chunked=self.chunked_req is not None,
            spec=self.spec.may_draft(self.running.reqs),
            mixed_chunk=self.admission.enable_mixed_chunk,
            write_through=self.config.kv_tier.kv_tier_write_policy == "write_through",
        ):
            self.sync()
        if self.chunked_req is not None:
            self.kv.cache_unfinished(self.chunked_req)
        batch = self._get_prefill_batch()
        if batch is None and self.running:
            batch = self._get_decode_batch()
        return batch

    def _get_prefill_batch(self) -> ScheduleBatch | None:
        """Decide (the policy orders, the adder plans), then commit (the KVManager allocates)."""
        if not self.waiting and self.chunked_req is None:
            return None
        max_new_reqs = (
            self.config.admission.max_running_requests
            - len(self.running)
            - (self.chunked_req is not None)
        )
        # a full batch admits no one, unless a more urgent request may preempt its way in
        may_enter = self.chunked_req is not None or self.config.admission.enable_priority_scheduling
        if max_new_reqs <= 0 and not may_enter:
            return None
        ordering = self.policy.calc_priority(
            self.waiting, self.stats.num_prefill_tokens, self.kv.available_size()
        )
        ratio = self.new_token_ratio.value
        adder = PrefillAdder(
            self.admission, self.kv, self.running.reqs, ratio, max(max_new_reqs, 0)
        )
        gate = self.loras.gate([*self.running.reqs, *filter(None, [self.chunked_req])])
        plan = adder.plan(
            self.waiting, ordering.matches, ordering.deprioritized, self.chunked_req, gate
        )
        for req, exc in self.loras.take_unreadable():  # its adapter's files went: it alone ends
            self.waiting.remove(req)
            self._fail(req, exc, release=True)
        return self._commit(plan)

    def _commit(self, plan: PrefillPlan) -> ScheduleBatch | None:
        """Run a plan: preempt its victims, then allocate its batch all or nothing (on a
        shortfall, the budget being an estimate, its new requests go back to the queue)."""
        new = plan.new_admissions()
        admitted = {a.req for a in new}
        self.waiting = [r for r in self.waiting if r not in admitted]
        self.policy.on_pass_done(self.waiting, [a.req for a in new])
        if plan.to_preempt:
            self._preempt(plan.to_preempt)
        if not plan.admitted:
            return None
        slots = self.kv.alloc_extend(plan.admitted)
        if slots is None:
            self.waiting[:0] = [a.req for a in new]
            return None
        for a in new:
            a.req.cached_tokens += a.prefix_len
            a.req.cached_tokens_tier += a.load_len
        self.chunked_req = plan.chunked
        forward, running_from = plan.admitted, None
        # --enable-mixed-chunk (runtime/mixed_chunk.py): not with speculation (a decode step may
        # be a verify) nor a batch in flight (get_next_batch waited for it: overlap_wait.py)
        mixed = self.admission.enable_mixed_chunk and not self.spec.enabled
        if mixed and self.running and self.in_flight is None:
            carried = carry_running(forward, slots, self.running, self.kv, self.max_context_len)
            if carried is not None:
                forward, slots, running_from = carried
                self.new_token_ratio.decay()
        batch = ScheduleBatch.extend(forward, slots, self.device, running_from)
        self.loras.attach(batch, keep=self.running.reqs)
        self.stats.on_prefill(batch, new)
        return batch

    def _get_decode_batch(self) -> ScheduleBatch | None:
        self.running.drop_done(self.max_context_len)
        if not self.running:
            return None
        lens = self.running.new_token_lens()
        if lens is not None:
            self.sync()  # jumped forward: every token must be known for the running extend
            self.running.drop_done(self.max_context_len)
            lens = self.running.new_token_lens()
        fresh = lens is None and self.in_flight is None  # drafts follow every token so far
        drafts = self.spec.propose(self.running.reqs, self.kv.available_size()) if fresh else None
        slots = self.kv.alloc_decode(self.running.reqs, lens or verify_lens(drafts))
        if slots is None:  # out of memory even after evicting the tree
            self.sync()
            drafts = None
            self.running.drop_done(self.max_context_len)
            self._retract_for_decode()
            lens = self.running.new_token_lens()
            slots = self.kv.alloc_decode(self.running.reqs, lens) if self.running else None
            if slots is None:
                if self.running:
                    self._abort_running("out of KV memory: the pool cannot hold even one request")
                return None
        batch = self.running.next_step(slots, lens, self.device, drafts)
        self.loras.attach(batch)
        if lens is not None:  # forced tokens: one extend step over the running batch
            self.stats.num_jump_batches += 1
        self.new_token_ratio.decay()
        return batch

    # ---- results --------------------------------------------------------------------------
    def process_result(self, batch: ScheduleBatch, result: BatchResult) -> None:
        in_next = set(self.in_flight[0].reqs) if self.in_flight is not None else set()
        new_running: list[Req] = []
        for i, req in enumerate(batch.reqs):
            if req.is_finished:  # finished in the batch before; its token here is dropped
                if req not in in_next:
                    self.kv.release(req)
                continue
            result.collect_input_logprobs(req, i)
            if not batch.samples[i]:
                continue
            try:
                out, jumped = advance(
                    req, result, i, self.max_context_len, self.tokenizer, self.enable_jump_forward
                )
            except Exception as exc:  # that request's own objects failed: it alone ends
                self._fail(req, exc, release=req not in in_next)
                continue
            self.stats.num_jumped_tokens += jumped
            self.pending_outputs.append(out)
            if req.is_finished:
                self._finish(req, release=req not in in_next)
            elif not batch.is_decode and not batch.stays_running(i):
                # cache the prompt now, so requests sharing it hit while this one decodes
                self.kv.cache_unfinished(req)
                new_running.append(req)
        if new_running:
            self.running.merge(new_running)
        self.spec.on_result(batch, result)  # a verify's rejected drafts leave its KV
        self.stats.on_result(batch)

    def _fail(self, req: Req, exc: Exception, release: bool) -> None:
        logger.error("request %s failed: %r", req.rid, exc, exc_info=exc)
        req.finish_reason = FinishReason(FinishKind.ABORT, message=f"internal error: {exc!r}")
        self.stats.num_failed_reqs += 1
        self.pending_outputs.append(make_output(req, []))
        self._finish(req, release)

    def _finish(self, req: Req, release: bool = True) -> None:
        self.stats.num_finished_reqs += 1
        self.reqs.pop(req.rid, None)
        self.running.filter(drop={req})
        if self.chunked_req is req:
            self.chunked_req = None
        self.loras.release(req)
        if release:
            self.kv.release(req)

    # ---- aborts, preemption, retraction ------------------------------------------------------
    def _apply_aborts(self) -> None:
        if not self.pending_aborts:
            return
        in_flight = set(self.in_flight[0].reqs) if self.in_flight is not None else set()
        for rid in list(self.pending_aborts):
            req = self.reqs.get(rid)
            self.pending_aborts.discard(rid)
            if req is None or req.is_finished:
                continue
            if req in self.waiting:
                self.waiting.remove(req)
            req.finish_reason = FinishReason(FinishKind.ABORT, message="aborted by the client")
            self.stats.num_aborted_reqs += 1
            self.pending_outputs.append(make_output(req, []))
            self._finish(req, release=req not in in_flight)

    def _abort_running(self, message: str) -> None:
        for req in list(self.running.reqs):
            req.finish_reason = FinishReason(FinishKind.ABORT, message=message)
            self.pending_outputs.append(make_output(req, []))
            self._finish(req)
        logger.error(message)

    def _preempt(self, victims: list[Req]) -> None:
        self.sync()
        for req in victims:
            if not req.is_finished and req in self.running.reqs:
                self.send_back(req, retracted=False)

    def _retract_for_decode(self) -> None:
        """Evict first (done by the failed allocation); then retract (``runtime/retraction.py``),
        the chunked request too if still short; then reset ``new_token_ratio``."""
        steps = self.constants.retract_decode_steps
        retract(self.running.reqs, self.kv.available_size, self.send_back, steps)
        chunked = self.chunked_req
        if chunked is not None and self.kv.available_size() < need(self.running.reqs, steps):
            self.chunked_req = None
            self.send_back(chunked)
        self.new_token_ratio.after_retraction(self.running.reqs)

    def send_back(self, req: Req, retracted: bool = True) -> None:
        """Release the request's KV (caching what it computed, or swapping it to the tier) and
        queue it again, output kept; counted as a retraction or a preemption."""
        self.running.filter(drop={req})
        self.stats.num_swapped_out_tokens += self.kv.send_back(req, self.swap)
        if req.grammar is not None:
            req.grammar.sync_to(req.output_ids)
        self.waiting.insert(0, req)
        if retracted:
            req.num_retractions += 1
            self.stats.num_retractions += 1
        else:
            req.num_preemptions += 1
            self.stats.num_preemptions += 1

    # ---- helpers ---------------------------------------------------------------------------
    def take_outputs(self) -> list[ReqOutput]:
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    def flush_cache(self) -> bool:
        if self.has_work:
            return False
        return self.kv.flush()

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.reqs.values())
        self.loras.check_integrity(self.reqs.values())

    def get_stats(self) -> dict[str, Any]:
        num_running = len(self.running) + (self.chunked_req is not None)
        ratio = self.new_token_ratio.value
        return self.stats.snapshot(self.kv, num_running, len(self.waiting), ratio)

    def check_alive(self) -> None:
        """``RuntimeError`` if the model cannot run any more (a tensor-parallel rank died)."""
        self.worker.check_alive()

    def shutdown(self) -> None:
        try:  # a file tier's index, with nothing in flight: a restarted server hits it
            self.sync()
            self.kv.close_tier()
        except Exception:
            logger.exception("the KV tier's index was not saved")
        self.worker.shutdown()
