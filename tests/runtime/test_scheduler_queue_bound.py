"""``max_queued_requests`` in the scheduler (issue #28, item 4; the server's 429:
tests/api/test_server_queue_bound.py)."""

from __future__ import annotations

import pytest
from fake_worker import fake_scheduler

from radixserve.config import EngineConfig
from radixserve.runtime.io_struct import GenerateRequest, QueueFull
from radixserve.types import SamplingParams

BOUND = 2


def test_the_scheduler_refuses_past_the_bound_and_keeps_the_queue() -> None:
    scheduler, _ = fake_scheduler(max_running=1, max_queued_requests=BOUND)
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    for i in range(BOUND):
        scheduler.add_request(GenerateRequest(f"r{i}", [5 + i, 6, 7], params))
    with pytest.raises(QueueFull, match="queue is full"):
        scheduler.add_request(GenerateRequest("late", [9, 9], params))
    assert [r.rid for r in scheduler.waiting] == ["r0", "r1"]
    scheduler.step()  # r0 starts running: one place is free in the queue
    scheduler.add_request(GenerateRequest("next", [9, 9], params))
    finished = []
    while scheduler.has_work:
        finished += [o.rid for o in scheduler.step() if o.finish_reason is not None]
    assert finished == ["r0", "r1", "next"]
    scheduler.check_integrity()


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_queued_requests"):
        EngineConfig(max_queued_requests=0)
