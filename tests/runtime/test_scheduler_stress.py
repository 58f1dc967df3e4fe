"""500 random requests on a pool small enough to force eviction, retraction and preemption."""

from __future__ import annotations

import random
import threading

import pytest

from radixserve.config import EngineConfig, SchedulerConstants
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.scheduler import Scheduler
from radixserve.types import FinishKind, SamplingParams


def make_requests(n: int, seed: int = 0) -> list[tuple[GenerateRequest, int | None]]:
    """(request, step at which to abort it or None)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(5, 1000) for _ in range(rng.randint(10, 40))] for _ in range(6)]
    out = []
    for i in range(n):
        prompt = list(rng.choice(systems)) if rng.random() < 0.8 else []
        prompt += [rng.randrange(5, 1000) for _ in range(rng.randint(1, 30))]
        params = SamplingParams(max_new_tokens=rng.randint(1, 48), temperature=0.0, ignore_eos=True)
        abort_at = rng.randint(0, 40) if rng.random() < 0.1 else None
        # a wave of low-priority work first, so later urgent requests find it running
        priority = 0 if i < 150 else rng.choice([0, 5, 20, 40])
        out.append((GenerateRequest(f"r{i}", prompt, params, priority=priority), abort_at))
    return out


def run(scheduler: Scheduler, requests, arrivals_per_step: int, check: bool) -> dict[str, object]:
    pending = list(requests)
    results: dict[str, object] = {}
    tokens: dict[str, list[int]] = {}
    step = 0
    abort_at = {}
    while pending or scheduler.has_work:
        for request, when in pending[:arrivals_per_step]:
            scheduler.add_request(request)
            if when is not None:
                abort_at[request.rid] = step + when
        pending = pending[arrivals_per_step:]
        for rid, when in list(abort_at.items()):
            if when <= step:
                scheduler.abort_request(rid)
                del abort_at[rid]
        for out in scheduler.step():
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finish_reason is not None:
                assert out.rid not in results, "a request finished twice"
                results[out.rid] = (out.finish_reason, tokens[out.rid])
        if check:
            scheduler.check_integrity()
        step += 1
        assert step < 20_000, "the scheduler does not make progress"
    return results


@pytest.fixture(scope="module")
def unconstrained(engine_model_dir) -> dict[str, object]:
    """The 500 requests' outputs on a pool that holds them all, no abort (the oracle of each
    overlap mode's run)."""
    base = dict(model_path=str(engine_model_dir), dtype="float32", random_seed=0)
    reference = Scheduler(
        EngineConfig.from_flat(
            **base, max_total_tokens=60_000, max_running_requests=64, chunked_prefill_size=None
        )
    )
    try:
        return run(reference, [(r, None) for r, _ in make_requests(500)], 500, check=False)
    finally:
        reference.shutdown()


@pytest.mark.parametrize("overlap", ["off", "thread", "stream", "off-mixed", "thread-mixed"])
def test_stress_small_pool(engine_model_dir, unconstrained, overlap: str) -> None:
    """Every KV path under pressure; with overlap launched from the worker thread or from the
    scheduler thread (``--overlap-launch stream``: on the CPU the same results, serialized);
    ``-mixed``: with ``--enable-mixed-chunk``, prefill steps carrying the running requests."""
    overlap, _, mixed = overlap.partition("-")
    requests = make_requests(500)
    expected = unconstrained
    base = dict(model_path=str(engine_model_dir), dtype="float32", random_seed=0)
    config = EngineConfig.from_flat(
        **base,
        max_total_tokens=400,
        max_running_requests=24,
        chunked_prefill_size=32,
        schedule_policy="lpm",
        enable_priority_scheduling=True,
        disable_overlap_schedule=overlap == "off",
        overlap_launch="thread" if overlap == "off" else overlap,
        enable_mixed_chunk=bool(mixed),
        # a fast-decaying new_token_ratio over-admits sooner, so decode runs out and retracts
        constants=SchedulerConstants(new_token_ratio_decay_steps=40),
    )
    scheduler = Scheduler(config)
    got = run(scheduler, requests, 7, check=True)
    stats = scheduler.get_stats()
    scheduler.shutdown()

    assert set(got) == {r.rid for r, _ in requests}, "every request finishes or aborts"
    num_aborted = 0
    for rid, (reason, ids) in got.items():
        if reason.kind is FinishKind.ABORT:
            num_aborted += 1
            assert ids == expected[rid][1][: len(ids)]
        else:
            assert ids == expected[rid][1], f"{rid} differs from the unconstrained run"
    assert num_aborted > 0
    assert stats["num_retractions"] > 0 and stats["num_preemptions"] > 0
    assert (stats["num_mixed_batches"] > 0) == bool(mixed)
    assert (
        stats["num_free_tokens"] + stats["num_cached_tokens_in_tree"] == stats["max_total_tokens"]
    )


@pytest.mark.parametrize("launch", [None, "thread", "stream"])
def test_where_an_overlapped_batch_is_launched(engine_model_dir, launch: str | None) -> None:
    """``--overlap-launch``: the worker thread (the default; docs/design.md, "Overlap scheduling"),
    or the scheduler thread itself (``stream``)."""
    options = {} if launch is None else {"overlap_launch": launch}
    config = EngineConfig.from_flat(model_path=str(engine_model_dir), dtype="float32", **options)
    scheduler = Scheduler(config)
    runner = scheduler.worker.runner  # type: ignore[attr-defined]
    forward, on_main = runner.forward, set()

    def recorded(batch):
        on_main.add(threading.current_thread() is threading.main_thread())
        return forward(batch)

    runner.forward = recorded
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    scheduler.add_request(GenerateRequest("r", list(range(10, 30)), params))
    while scheduler.has_work:
        scheduler.step()
    scheduler.shutdown()
    assert scheduler.worker.overlap and on_main == {launch == "stream"}
