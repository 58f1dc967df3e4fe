"""The event loop: sessions -> router -> replicas (a real Scheduler each) on one virtual clock.

Events, in time order; at one instant: finished steps deliver their outputs (which may send
next turns), then requests due are routed and queued, then every free replica with work runs
one ``Scheduler.step()``. A step is computed at once, but its outputs are delivered when its
cost has passed (the replica is busy until then), so a next turn is sent, and a TTFT measured,
at the virtual time the real runtime would have reached.

Clients as in ``radixserve bench`` (``bench/runner.py``): ``parallel`` clients each take the
next session in arrival order, wait for its arrival, and send its turns one after another
(closed loop); ``parallel=None``: every session is its own client (an open loop, for replayed
logs).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from radixserve.config import EngineConfig
from radixserve.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.radix import NoPrefixCache, PrefixCache, RadixCache
from radixserve.radix.kv_events import KVCacheEvent, KVEventRecorder
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.lora_manager import LoraManager
from radixserve.runtime.scheduler import Scheduler
from radixserve.sim.clock import VirtualClock
from radixserve.sim.cost_model import CostModel
from radixserve.sim.router import EVENT_POLICIES, CacheAwareConfig, Router
from radixserve.sim.sim_worker import SimWorker
from radixserve.sim.trace import SimSession
from radixserve.types import SamplingParams


@dataclass(slots=True)
class SimRecord:
    """One request; times in virtual seconds from the start of the run."""

    sid: int
    turn: int
    replica: int
    prompt_ids: np.ndarray
    output_len: int
    sent_s: float
    first_token_s: float | None = None
    done_s: float | None = None
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    lora: str | None = None  # its LoRA adapter: the namespace of its cache hits


class Replica:
    """One simulated server: a real Scheduler over its own pools and tree, a SimWorker."""

    def __init__(
        self,
        config: EngineConfig,
        cost: CostModel,
        clock: VirtualClock,
        max_context_len: int,
        token_range: tuple[int, int],
        seed: int,
        adapters: Iterable[str] = (),
        kv_events: bool = False,
    ) -> None:
        if config.max_total_tokens is None:
            raise ValueError("a simulated replica needs max_total_tokens (its KV pool)")
        page = config.page_size
        tree: PrefixCache
        recorder = None
        if config.disable_radix_cache:
            tree = NoPrefixCache(page)
        else:
            recorder = KVEventRecorder(page) if kv_events else None
            tree = RadixCache(page, recorder)
        self.events = recorder  # what its router hears of its cache (None: nothing)
        slots = (-(-config.max_total_tokens // page) + 1) * page
        self.kv = KVManager(
            ReqToTokenPool(config.admission.max_running_requests, max_context_len),
            TokenToKVPoolAllocator(slots, page),
            tree,
        )
        self.worker = SimWorker(cost, token_range, seed)
        loras = LoraManager.weightless(config.lora.max_loras_per_batch)
        for name in adapters:
            loras.load(name, name)
        self.scheduler = Scheduler(config, kv=self.kv, worker=self.worker, clock=clock, loras=loras)
        self.busy_until = 0.0  # its step in progress ends then (inf: idle, nothing to do)
        self.pending: list[ReqOutput] | None = None  # that step's outputs, due at busy_until
        self.pending_events: list[KVCacheEvent] = []  # and its KV events


@dataclass(frozen=True, slots=True)
class SimOptions:
    config: EngineConfig  # per replica: max_total_tokens is its KV pool
    cost: CostModel
    dp_size: int = 1
    router_policy: str = "round_robin"
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    parallel: int | None = 64  # concurrent clients; None: one per session (open loop)
    token_range: tuple[int, int] = (3, 32000)
    seed: int = 0
    check_integrity_every: int = 0  # > 0: check every replica's KV after that many steps


@dataclass(slots=True)
class SimResult:
    records: list[SimRecord]  # in send order
    wall_s: float  # virtual: the last request's completion
    counters: dict[str, int]
    load_split: list[float]
    num_steps: int


class Simulation:
    def __init__(self, opts: SimOptions, sessions: list[SimSession]) -> None:
        if opts.dp_size < 1:
            raise ValueError("dp_size must be >= 1")
        if opts.parallel is not None and opts.parallel < 1:
            raise ValueError("parallel must be >= 1 (or None)")
        self.opts = opts
        self.clock = VirtualClock()
        self.sessions = sorted(sessions, key=lambda s: (s.arrival_s, s.sid))
        ctx = _max_context_len(self.sessions)
        adapters = sorted({s.lora for s in self.sessions if s.lora is not None})
        events = opts.router_policy in EVENT_POLICIES
        self.replicas = [
            Replica(
                opts.config,
                opts.cost,
                self.clock,
                ctx,
                opts.token_range,
                opts.seed + i,
                adapters,
                events,
            )
            for i in range(opts.dp_size)
        ]
        self.router = Router(
            opts.router_policy, opts.dp_size, opts.cache_aware, opts.seed, opts.config.page_size
        )
        self.records: list[SimRecord] = []
        self._due: list[tuple[float, int, int, int, np.ndarray]] = []  # (t, seq, sid, turn, hist)
        self._seq = itertools.count()
        self._inflight: dict[str, SimRecord] = {}
        self._by_sid = {s.sid: s for s in self.sessions}
        self._todo = deque(self.sessions)
        self.num_steps = 0

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> SimResult:
        clients = len(self._todo) if self.opts.parallel is None else self.opts.parallel
        for _ in range(min(clients, len(self._todo))):
            self._start_next_session(0.0)
        every = self.opts.check_integrity_every
        while True:
            t_due = self._due[0][0] if self._due else math.inf
            t_rep = min(r.busy_until for r in self.replicas)
            now = min(t_due, t_rep)
            if now == math.inf:
                break
            self.clock.advance_to(now)
            for i, r in enumerate(self.replicas):
                if r.pending is not None and r.busy_until <= now:
                    outputs, r.pending = r.pending, None
                    self._publish(i, r)
                    self._deliver(r, outputs, now)
            while self._due and self._due[0][0] <= now:
                _, _, sid, turn, history = heapq.heappop(self._due)
                self._send(sid, turn, history, now)
            for r in self.replicas:
                if r.busy_until <= now and r.pending is None:
                    self._step(r, now)
                    if every and self.num_steps % every == 0:
                        r.scheduler.check_integrity()
        stuck = [i for i, r in enumerate(self.replicas) if r.scheduler.has_work]
        if stuck or self._inflight:
            raise RuntimeError(f"the simulation stopped with work left on replicas {stuck}")
        counters = {k: 0 for k in ("num_retractions", "num_preemptions", "num_prefill_batches")}
        for r in self.replicas:
            for k in counters:
                counters[k] += getattr(r.scheduler.stats, k)
            counters["num_decode_batches"] = counters.get("num_decode_batches", 0) + (
                r.scheduler.stats.num_decode_batches
            )
        total = max(sum(self.router.num_routed), 1)
        wall = max((rec.done_s or 0.0 for rec in self.records), default=0.0)
        return SimResult(
            self.records,
            wall,
            counters,
            [n / total for n in self.router.num_routed],
            self.num_steps,
        )

    def _step(self, r: Replica, now: float) -> None:
        if not r.scheduler.has_work:
            r.busy_until = math.inf
            return
        before = r.worker.num_batches
        outputs = r.scheduler.step()
        self.num_steps += 1
        if r.events is not None:  # published when the step ends
            r.pending_events.extend(r.events.take())
        if r.worker.num_batches == before:  # nothing could run: wait for the next arrival
            r.busy_until = math.inf
            self._publish(self.replicas.index(r), r)
            if outputs:
                self._deliver(r, outputs, now)
            return
        r.busy_until = now + r.worker.last_cost_s
        r.pending = outputs

    def _publish(self, i: int, r: Replica) -> None:
        if r.pending_events:
            self.router.observe(i, r.pending_events)
            r.pending_events = []

    # ---- clients --------------------------------------------------------------------------
    def _start_next_session(self, now: float) -> None:
        if not self._todo:
            return
        s = self._todo.popleft()
        heapq.heappush(self._due, (max(now, s.arrival_s), next(self._seq), s.sid, 0, s.prefix_ids))

    def _send(self, sid: int, turn: int, history: np.ndarray, now: float) -> None:
        session = self._by_sid[sid]
        t = session.turns[turn]
        prompt = np.concatenate([history, t.user_ids]) if len(history) else t.user_ids
        i = self.router.pick(prompt, now)
        rid = f"s{sid}-t{turn}"
        record = SimRecord(sid, turn, i, prompt, t.output_len, now, lora=session.lora)
        params = SamplingParams(max_new_tokens=t.output_len, temperature=0.0, ignore_eos=True)
        r = self.replicas[i]
        request = GenerateRequest(rid, prompt.tolist(), params, lora_name=session.lora)
        r.scheduler.add_request(request)
        self._inflight[rid] = record
        self.records.append(record)
        if r.pending is None:
            r.busy_until = min(r.busy_until, now)

    def _deliver(self, r: Replica, outputs: list[ReqOutput], now: float) -> None:
        for out in outputs:
            record = self._inflight[out.rid]
            if out.new_token_ids:
                if record.first_token_s is None:
                    record.first_token_s = now
                record.output_ids.extend(out.new_token_ids)
            if out.finish_reason is None:
                continue
            del self._inflight[out.rid]
            record.done_s = now
            record.cached_tokens = out.cached_tokens
            self.router.done(record.replica)
            session = self._by_sid[record.sid]
            if record.turn + 1 < len(session.turns):
                history = np.concatenate(
                    [record.prompt_ids, np.asarray(record.output_ids, dtype=np.int32)]
                )
                heapq.heappush(
                    self._due, (now, next(self._seq), record.sid, record.turn + 1, history)
                )
            else:
                self._start_next_session(now)


def _max_context_len(sessions: list[SimSession]) -> int:
    """The longest sequence any turn can reach (prompt with its history, plus its output)."""
    longest = 1
    for s in sessions:
        n = len(s.prefix_ids)
        for t in s.turns:
            n += len(t.user_ids) + t.output_len
        longest = max(longest, n)
    return longest + 1
