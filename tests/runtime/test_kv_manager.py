"""KV memory with no model: admission, chunking, retraction, preemption, abort and finish through
the real Scheduler, policy, radix tree and KVManager, with ``check_integrity()`` after every step.

The fake model's tokens depend only on a request's own tokens, so every run must reproduce the
outputs of decoding each request alone (:func:`reference_output`), however small the pool.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from fake_worker import fake_scheduler, next_token
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixserve.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixserve.policy import Admission
from radixserve.radix import RadixCache
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.scheduler import Scheduler
from radixserve.types import FinishKind, Req, SamplingParams

PAGE_SIZES = [1, 4, 16]
_rids = itertools.count()


def reference_output(prompt: list[int], max_new: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(max_new):
        out.append(next_token(seq))
        seq.append(out[-1])
    return out


def request(prompt: list[int], max_new: int, priority: int = 0) -> GenerateRequest:
    return GenerateRequest(
        f"r{next(_rids)}", prompt, SamplingParams(max_new_tokens=max_new), priority=priority
    )


def drive(
    sched: Scheduler, max_steps: int = 5000, on_step: object = None
) -> dict[str, tuple[list[int], FinishKind]]:
    """Step until idle, checking integrity after every step; outputs and finish kind per rid."""
    outputs: dict[str, list[int]] = {}
    done: dict[str, tuple[list[int], FinishKind]] = {}
    for step in range(max_steps):
        if not sched.has_work:
            return done
        for out in sched.step():
            outputs.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finish_reason is not None:
                done[out.rid] = (outputs[out.rid], out.finish_reason.kind)
        sched.check_integrity()
        if callable(on_step):
            on_step(step)
    raise AssertionError("the scheduler did not go idle")


def assert_pool_back_to_full(sched: Scheduler) -> None:
    assert sched.flush_cache()
    kv = sched.kv
    assert kv.allocator.available_size() == kv.capacity
    assert kv.req_to_token_pool.available_size() == kv.req_to_token_pool.size
    sched.check_integrity()


def shared_prefix_requests(
    num_groups: int, per_group: int, page_size: int
) -> list[GenerateRequest]:
    reqs = []
    for g in range(num_groups):
        prefix = [1 + (g * 97 + i) % 900 for i in range(48)]
        for j in range(per_group):
            reqs.append(request(prefix + [g, j, 5 + j, 7], max_new=12 + j))
    return reqs


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("overlap", [False, True])
def test_shared_prefixes_hit_chunk_and_evict(page_size: int, overlap: bool) -> None:
    sched, _ = fake_scheduler(
        page_size, capacity=320, chunked_prefill_size=32, overlap=overlap, schedule_policy="lpm"
    )
    reqs = shared_prefix_requests(4, 4, page_size)
    for r in reqs:
        sched.add_request(r)
    done = drive(sched)
    for r in reqs:
        assert done[r.rid] == (
            reference_output(r.input_ids, r.sampling_params.max_new_tokens),
            FinishKind.LENGTH,
        )
    stats = sched.get_stats()
    assert stats["num_cached_prompt_tokens"] > 0  # the shared prefixes hit
    total_tokens = sum(len(r.input_ids) + r.sampling_params.max_new_tokens for r in reqs)
    assert total_tokens > 2 * sched.kv.capacity  # so the tree had to evict
    assert_pool_back_to_full(sched)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_exhausting_the_pool_retracts_and_every_request_still_finishes(page_size: int) -> None:
    sched, _ = fake_scheduler(page_size, capacity=384, chunked_prefill_size=64)
    reqs = [request([100 + 7 * i + k for k in range(20)], max_new=60) for i in range(8)]
    for r in reqs:
        sched.add_request(r)
    done = drive(sched)
    assert sched.stats.num_retractions > 0
    for r in reqs:
        assert done[r.rid][0] == reference_output(r.input_ids, 60)
    assert_pool_back_to_full(sched)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_priority_preemption_frees_room_and_the_victims_resume(page_size: int) -> None:
    sched, _ = fake_scheduler(
        page_size, capacity=192, enable_priority_scheduling=True, chunked_prefill_size=None
    )
    low = [request([200 + 11 * i + k for k in range(30)], max_new=40) for i in range(4)]
    for r in low:
        sched.add_request(r)
    urgent = request(list(range(300, 400)), max_new=10, priority=100)

    def arrive(step: int) -> None:
        if step == 3:
            sched.add_request(urgent)

    done = drive(sched, on_step=arrive)
    assert sched.stats.num_preemptions > 0
    for r in [*low, urgent]:
        assert done[r.rid][0] == reference_output(r.input_ids, r.sampling_params.max_new_tokens)
    assert_pool_back_to_full(sched)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_abort_while_waiting_chunked_and_decoding(page_size: int) -> None:
    sched, _ = fake_scheduler(page_size, capacity=512, chunked_prefill_size=16, max_running=2)
    decoding = request(list(range(1, 10)), max_new=200)
    chunked = request(list(range(500, 600)), max_new=5)  # 100 tokens: chunks of 16
    waiting = request(list(range(700, 720)), max_new=5)
    for r in (decoding, chunked, waiting):
        sched.add_request(r)

    aborted_at: list[int] = []

    def abort_all(step: int) -> None:
        """Once one request decodes, one is mid-prompt and one waits for a running slot."""
        if (
            not aborted_at
            and sched.chunked_req is not None
            and sched.chunked_req.rid == chunked.rid
            and any(r.rid == waiting.rid for r in sched.waiting)
            and any(r.rid == decoding.rid and r.output_ids for r in sched.running.reqs)
        ):
            aborted_at.append(step)
            for r in (decoding, chunked, waiting):
                sched.abort_request(r.rid)

    done = drive(sched, on_step=abort_all)
    assert aborted_at, "the three states were never reached together"
    assert {done[r.rid][1] for r in (decoding, chunked, waiting)} == {FinishKind.ABORT}
    assert sched.stats.num_aborted_reqs == 3
    assert_pool_back_to_full(sched)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_extend_is_all_or_nothing(page_size: int) -> None:
    slots = 4 * page_size + page_size  # four usable pages
    kv = KVManager(
        ReqToTokenPool(4, 256), TokenToKVPoolAllocator(slots, page_size), RadixCache(page_size)
    )
    cached = list(range(2 * page_size))
    held = kv.allocator.alloc(len(cached))
    assert held is not None
    kv.tree.insert(cached, held)
    reqs = [Req(f"a{i}", cached + [900 + i] * (2 * page_size)) for i in range(2)]
    admissions = []
    for req in reqs:  # as the adder does: match, and lock the match in the plan
        match = kv.tree.match_prefix(req.fill_ids[:-1])
        kv.tree.inc_lock_ref(match.last_node)
        admissions.append(Admission(req, match, req.seq_len - len(match.indices)))
    free_before = kv.allocator.available_size()
    # each needs 2 pages of its own: 4 in all, but only 2 are free and the prefix is locked
    assert kv.alloc_extend(admissions) is None
    assert kv.allocator.available_size() == free_before
    assert kv.tree.protected_size() == 0 and kv.tree.evictable_size() == len(cached)
    assert all(r.req_pool_idx is None and r.last_node is None and r.kv_len == 0 for r in reqs)
    kv.check_integrity(reqs)
    # one of them fits: its row points at the cached prefix, then at its own new slots
    match = kv.tree.match_prefix(reqs[0].fill_ids[:-1])
    kv.tree.inc_lock_ref(match.last_node)
    new = kv.alloc_extend([Admission(reqs[0], match, 2 * page_size)])
    assert new is not None and len(new) == 2 * page_size
    row = kv.row_slots(reqs[0])
    assert torch.equal(row[: len(cached)], held) and torch.equal(row[len(cached) :], new)
    kv.check_integrity(reqs)
    kv.release(reqs[0])
    kv.check_integrity(reqs)
    assert kv.tree.total_size() == 4 * page_size and kv.allocator.available_size() == 0


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals, steps, aborts and flushes over a small pool; integrity after each."""

    def __init__(self) -> None:
        super().__init__()
        self.sched: Scheduler | None = None
        self.submitted: dict[str, tuple[list[int], int]] = {}
        self.outputs: dict[str, list[int]] = {}
        self.finished: dict[str, FinishKind] = {}

    @rule(
        page_size=st.sampled_from(PAGE_SIZES),
        policy=st.sampled_from(["fcfs", "lpm", "dfs-weight"]),
        radix=st.booleans(),
    )
    @precondition(lambda self: self.sched is None)
    def start(self, page_size: int, policy: str, radix: bool) -> None:
        self.sched, _ = fake_scheduler(
            page_size,
            capacity=160,
            chunked_prefill_size=32,
            max_running=4,
            schedule_policy=policy,
            radix=radix,
        )

    @rule(group=st.integers(0, 2), suffix=st.integers(1, 40), max_new=st.integers(1, 30))
    @precondition(lambda self: self.sched is not None)
    def add(self, group: int, suffix: int, max_new: int) -> None:
        assert self.sched is not None
        prompt = [10 + group] * 24 + [500 + (suffix * 13 + k) % 400 for k in range(suffix)]
        r = request(prompt, max_new)
        self.sched.add_request(r)
        self.submitted[r.rid] = (prompt, max_new)

    @rule(n=st.integers(1, 8))
    @precondition(lambda self: self.sched is not None)
    def step(self, n: int) -> None:
        assert self.sched is not None
        for _ in range(n):
            for out in self.sched.step():
                self.outputs.setdefault(out.rid, []).extend(out.new_token_ids)
                if out.finish_reason is not None:
                    self.finished[out.rid] = out.finish_reason.kind
            self.sched.check_integrity()

    @rule(data=st.data())
    @precondition(lambda self: self.sched is not None and bool(self.submitted))
    def abort(self, data: st.DataObject) -> None:
        assert self.sched is not None
        rid = data.draw(st.sampled_from(sorted(self.submitted)))
        self.sched.abort_request(rid)

    @rule()
    @precondition(lambda self: self.sched is not None)
    def flush(self) -> None:
        assert self.sched is not None
        flushed = self.sched.flush_cache()
        assert flushed == (not self.sched.has_work)

    @invariant()
    def integrity(self) -> None:
        if self.sched is not None:
            self.sched.check_integrity()

    def teardown(self) -> None:
        if self.sched is None:
            return
        for rid, (tokens, kind) in drive(self.sched).items():
            self.outputs[rid] = self.outputs.get(rid, []) + tokens
            self.finished[rid] = kind
        for rid, (prompt, max_new) in self.submitted.items():
            if self.finished.get(rid) is FinishKind.LENGTH:
                assert self.outputs[rid] == reference_output(prompt, max_new)
        assert_pool_back_to_full(self.sched)


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
