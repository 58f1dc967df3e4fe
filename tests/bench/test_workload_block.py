"""The block draw of token ids gives exactly what ``random.Random.randrange`` gives, one call
at a time, and leaves the generator where those calls would; the shared-prefix generator built
on it makes the sessions the per-token generator made."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixserve.bench.workload import (
    Session,
    SharedPrefixSpec,
    TokenSource,
    Turn,
    make_shared_prefix,
    randrange_block,
)
from radixserve.sim.trace import from_bench_sessions, shared_prefix_sessions


@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize(
    ("low", "high"),
    [(3, 32000), (0, 1), (0, 2), (5, 2**16 + 5), (0, 2**31), (1, 2**32), (7, 2**32 + 8), (3, 500)],
)
@pytest.mark.parametrize("n", [0, 1, 300, 5000])
def test_block_draw_is_randrange(seed: int, low: int, high: int, n: int) -> None:
    a, b = random.Random(seed), random.Random(seed)
    a.random(), b.random()  # not at a fresh state
    expected = [a.randrange(low, high) for _ in range(n)]
    assert randrange_block(b, low, high, n).tolist() == expected
    assert a.getstate() == b.getstate()
    assert a.random() == b.random()


def test_block_draw_refuses_an_empty_range() -> None:
    with pytest.raises(ValueError, match="empty range"):
        randrange_block(random.Random(0), 5, 5, 3)


def _shared_prefix_per_token(spec: SharedPrefixSpec, low: int, high: int) -> list[Session]:
    """The per-token generator the block draw must equal: one ``randrange`` per token."""
    rng = random.Random(spec.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(low, high) for _ in range(n)]

    systems = [ids(spec.system_len) for _ in range(spec.num_groups)]
    pairs = [
        (systems[g], Turn(ids(spec.question_len), spec.output_len, ids(spec.output_len)))
        for g in range(spec.num_groups)
        for _ in range(spec.prompts_per_group)
    ]
    rng.shuffle(pairs)
    sessions, t = [], 0.0
    for sid, (system, turn) in enumerate(pairs):
        sessions.append(Session(sid, list(system), [turn], arrival_s=t))
        if spec.request_rate != float("inf"):
            t += rng.expovariate(spec.request_rate)
    return sessions


@pytest.mark.parametrize(
    "spec",
    [
        SharedPrefixSpec(num_groups=3, prompts_per_group=5, seed=4),
        SharedPrefixSpec(num_groups=2, prompts_per_group=7, system_len=40, question_len=300),
        SharedPrefixSpec(num_groups=4, prompts_per_group=3, request_rate=2.0, seed=9),
        SharedPrefixSpec(num_groups=1, prompts_per_group=2, system_len=0, output_len=0),
    ],
)
def test_shared_prefix_sessions_are_those_of_the_per_token_generator(
    spec: SharedPrefixSpec,
) -> None:
    assert make_shared_prefix(spec, 3, 32000) == _shared_prefix_per_token(spec, 3, 32000)


def test_token_source_long_and_short_draws_continue_one_stream() -> None:
    src, ref = TokenSource(3, 500, 8), random.Random(8)
    got = src.ids(10) + src.ids(1000) + src.ids(3)
    assert got == [ref.randrange(3, 500) for _ in range(1013)]


@pytest.mark.parametrize(
    "spec",
    [
        SharedPrefixSpec(num_groups=3, prompts_per_group=5, seed=4),
        SharedPrefixSpec(num_groups=4, prompts_per_group=3, request_rate=2.0, seed=9),
        SharedPrefixSpec(num_groups=3, prompts_per_group=2, system_len=0, output_len=0),
    ],
)
def test_simulator_sessions_from_the_arrays_are_those_from_the_lists(
    spec: SharedPrefixSpec,
) -> None:
    direct = shared_prefix_sessions(spec, 3, 32000)
    via_lists = from_bench_sessions(make_shared_prefix(spec, 3, 32000))
    assert len(direct) == len(via_lists)
    for a, b in zip(direct, via_lists, strict=True):
        assert (a.sid, a.arrival_s, len(a.turns)) == (b.sid, b.arrival_s, len(b.turns))
        assert a.prefix_ids.dtype == b.prefix_ids.dtype == np.int32
        assert a.prefix_ids.tolist() == b.prefix_ids.tolist()
        for ta, tb in zip(a.turns, b.turns, strict=True):
            assert ta.user_ids.dtype == np.int32
            assert (ta.user_ids.tolist(), ta.output_len) == (tb.user_ids.tolist(), tb.output_len)
    # one array per distinct prefix, shared by the group's sessions, in both
    assert len({id(s.prefix_ids) for s in direct}) == len({id(s.prefix_ids) for s in via_lists})
