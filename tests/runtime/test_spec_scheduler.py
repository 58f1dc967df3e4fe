"""Speculative decoding through the real Scheduler, policy, radix tree (and KV tier) and
KVManager, with the fake worker playing the model and its KV (``fake_worker.py``): chunked
prefill, decode retraction, priority preemption, swap to the tier and the overlap loop, with
drafts. The fake model mostly repeats what it wrote a period ago and now and then departs from
it, so prompt lookup and the tree draft tokens that are accepted, and some that are rejected.
Every output must equal the model's own continuation; integrity is checked after every step,
and any rejected draft's KV that reached the cache would fail a later forward's check."""

from __future__ import annotations

import pytest
from fake_worker import fake_scheduler, next_token
from test_kv_manager import PAGE_SIZES, assert_pool_back_to_full, drive, request

from radixserve.spec import StepCosts
from radixserve.types import FinishKind

pytestmark = pytest.mark.timeout(120)

PERIOD = 11


def looping(tokens: list[int]) -> int:
    """The token of a period ago, but at one position in seven a departure."""
    n = len(tokens)
    if n >= PERIOD and (n * 2654435761) % 7:
        return tokens[-PERIOD]
    return next_token(tokens)


def reference(prompt: list[int], max_new: int) -> list[int]:
    seq = list(prompt)
    for _ in range(max_new):
        seq.append(looping(seq))
    return seq[len(prompt) :]


def check(sched, reqs, done) -> None:  # type: ignore[no-untyped-def]
    for r in reqs:
        expected = reference(r.input_ids, r.sampling_params.max_new_tokens)
        assert done[r.rid] == (expected, FinishKind.LENGTH), r.rid
    stats = sched.get_stats()
    assert stats["num_spec_accepted_tokens"] > 0, stats
    assert stats["num_spec_draft_tokens"] > stats["num_spec_accepted_tokens"], stats


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    return [[1 + (seed * 131 + i * 17 + k * 7) % 900 for k in range(length)] for i in range(n)]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("overlap", [False, True])
def test_chunked_prefill_and_retraction_with_drafts(page_size: int, overlap: bool) -> None:
    sched, _ = fake_scheduler(
        page_size,
        capacity=384,
        chunked_prefill_size=32,
        overlap=overlap,
        model=looping,
        speculative_algorithm="NGRAM",
    )
    reqs = [request(p, max_new=60) for p in prompts(8, 20, 1)]
    reqs.append(request(prompts(1, 90, 2)[0], max_new=30))  # a prompt in chunks
    for r in reqs:
        sched.add_request(r)
    done = drive(sched)
    assert sched.stats.num_retractions > 0
    check(sched, reqs, done)
    # sent again: each drafts its earlier answer from the tree
    again = [request(r.input_ids, 30) for r in reqs[:4]]
    for r in again:
        sched.add_request(r)
    check(sched, again, drive(sched))
    assert_pool_back_to_full(sched)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_priority_preemption_and_the_tier_with_drafts(page_size: int, mode: str) -> None:
    sched, _ = fake_scheduler(
        page_size,
        capacity=192,
        enable_priority_scheduling=True,
        chunked_prefill_size=None,
        tier_tokens=2048,
        preemption_mode=mode,
        model=looping,
        speculative_algorithm="NGRAM",
    )
    low = [request(p, max_new=40) for p in prompts(4, 30, 3)]
    for r in low:
        sched.add_request(r)
    low_reqs = [sched.reqs[r.rid] for r in low]
    later = [request(list(range(300, 400)), max_new=10, priority=100)]
    later += [request(p, 4, priority=50) for p in prompts(3, 60, 4)]

    def arrive(step: int) -> None:
        if step == 3:
            for r in later:
                sched.add_request(r)

    done = drive(sched, on_step=arrive)
    assert any(r.num_preemptions for r in low_reqs)
    check(sched, [*low, *later], done)
    if mode == "swap":
        assert sched.get_stats()["num_swapped_out_tokens"] > 0
    assert_pool_back_to_full(sched)


def test_the_overlap_loop_waits_only_where_a_step_could_draft() -> None:
    """With speculation on, a step waits for the one in flight only where it could draft (its
    drafts follow every token so far): above ``--speculative-ngram-max-batch-size``, or where
    the cost model finds no draft worth a verify, the steps overlap as without speculation,
    look for no drafts, and outputs are the model's own."""
    sched, _ = fake_scheduler(
        overlap=True, model=looping, speculative_algorithm="NGRAM", speculative_ngram_max_batch_size=2
    )  # fmt: skip
    # the 8 requests end one after another: the last two run on alone, and draft
    reqs = [request(p, max_new=30 + 12 * i) for i, p in enumerate(prompts(8, 20, 5))]
    for r in reqs:
        sched.add_request(r)
    check(sched, reqs, drive(sched))
    assert sched.stats.num_overlapped_batches > 40  # the steps of more than two requests
    assert_pool_back_to_full(sched)

    def overlapped(overlap: bool = True, **spec: object) -> int:
        sched, _ = fake_scheduler(overlap=overlap, model=looping, **spec)  # type: ignore[arg-type]
        if spec:  # a verified token costs twice a decoded one: not even certain drafts pay
            sizes = (1, 1024)
            decode, verify = (tuple(1.0 + k * n for n in sizes) for k in (1, 2))
            sched.spec.cost = StepCosts(sizes, decode, sizes, verify)  # type: ignore[union-attr]
            sched.spec.drafter = None  # type: ignore[union-attr]  # no draft is even looked for
        again = [request(p, max_new=40) for p in prompts(4, 20, 6)]
        for r in again:
            sched.add_request(r)
        done = drive(sched)
        for r in again:
            assert done[r.rid][0] == reference(r.input_ids, 40)
        stats = sched.get_stats()
        assert stats["num_spec_drafts"] == 0, stats
        return int(stats["num_overlapped_batches"])

    assert overlapped(speculative_algorithm="NGRAM") == overlapped() > 30
    assert overlapped(False, speculative_algorithm="NGRAM") == 0  # no overlap, and no drafting
