"""``max_queued_requests`` in the scheduler (the server's 429:
tests/api/test_server_bounds.py)."""

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
        EngineConfig.from_flat(max_queued_requests=0)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("ignore_eos", [True, False])
def test_the_largest_request_add_request_takes_is_admitted_and_finishes(
    page_size: int, ignore_eos: bool
) -> None:
    """``add_request`` refuses exactly what admission could never take: the largest request it
    accepts runs to its end on an empty pool (before, one a token larger than admission's bound
    was accepted and waited forever); one token more is a ``ValueError``."""
    scheduler, _ = fake_scheduler(page_size, capacity=64, max_context_len=256)
    prompt = list(range(5, 5 + 13))
    most = scheduler.limits.max_request_tokens - len(prompt)
    params = SamplingParams(max_new_tokens=most + 1, temperature=0.0, ignore_eos=ignore_eos)
    with pytest.raises(ValueError, match="KV slots"):
        scheduler.add_request(GenerateRequest("big", prompt, params))
    params = SamplingParams(max_new_tokens=most, temperature=0.0, ignore_eos=ignore_eos)
    scheduler.add_request(GenerateRequest("fits", prompt, params))
    tokens, steps = 0, 0
    while scheduler.has_work:
        tokens += sum(len(o.new_token_ids) for o in scheduler.step())
        steps += 1
        assert steps < 10 * most, "the request that fits never finishes"
    assert tokens == most if ignore_eos else 0 < tokens <= most
    scheduler.check_integrity()
