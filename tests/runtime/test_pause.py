"""SGLang's ``pause_generation`` / ``continue_generation`` on the Engine (``runtime/pause.py``):
nothing is generated while paused, a request paused in place or retracted goes on to the very
tokens it gives without a pause (greedy), ``abort`` ends every request, and a request sent
while paused waits for continue. Whether a step ran is read from the scheduler's counters
through the loop thread (each call is one pass of the loop, which steps unless paused), never
from a clock."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from running_stream import paused_while_running

from radixserve import Engine

pytestmark = pytest.mark.timeout(180)
# long enough that the request is most often still running when the pause comes right after its
# first chunk (a few hundred steps of the tiny model); paused_while_running retries when not
PARAMS = {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(engine_model_dir):
    with Engine(str(engine_model_dir), dtype="float32", max_total_tokens=2048) as eng:
        yield eng


def _assert_nothing_runs(engine: Engine) -> None:
    before = engine.get_stats()
    for _ in range(3):  # three passes of the loop thread, each of which would have stepped
        after = engine.get_stats()
        assert after["num_generated_tokens"] == before["num_generated_tokens"]
        assert after["num_prefill_batches"] == before["num_prefill_batches"]


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_paused_stream_goes_on_to_the_same_tokens(engine: Engine, mode: str) -> None:
    prompt = f"def paused_{mode}(n):"
    reference = engine.generate(prompt, PARAMS)["output_ids"]
    with paused_while_running(engine, PARAMS, mode, prompt=prompt) as (got, stream):
        _assert_nothing_runs(engine)
        assert engine.get_stats()["num_running_reqs"] == (1 if mode == "in_place" else 0)
        engine.continue_generation()
        chunks = list(stream)
    got += [t for c in chunks for t in c["output_ids"]]
    assert got == reference
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    if mode == "retract":  # what it had computed was a hit when it came back
        assert chunks[-1]["meta_info"]["cached_tokens"] > 0
    engine.check_integrity()


def test_abort_ends_every_request_and_a_new_one_waits_for_continue(engine: Engine) -> None:
    with paused_while_running(engine, PARAMS, prompt="import os") as (_, stream):
        engine.pause_generation()  # SGLang's default mode: abort
        last = list(stream)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        assert engine.get_stats()["num_running_reqs"] == 0

    engine.pause_generation()  # nothing left to abort: paused
    result: dict[str, Any] = {}
    sender = threading.Thread(
        target=lambda: result.update(engine.generate("x = 1", {**PARAMS, "max_new_tokens": 4}))
    )
    sender.start()
    while engine.get_stats()["num_waiting_reqs"] == 0:  # queued, not started
        assert sender.is_alive(), result
    _assert_nothing_runs(engine)
    assert not result
    engine.continue_generation()
    sender.join(timeout=120)
    assert result["meta_info"]["completion_tokens"] == 4
    engine.check_integrity()


def test_an_unknown_mode_is_refused_and_pauses_nothing(engine: Engine) -> None:
    with pytest.raises(ValueError, match="mode must be one of abort, retract, in_place"):
        engine.pause_generation("sleep")
    out = engine.generate("y = 2", {**PARAMS, "max_new_tokens": 3})
    assert out["meta_info"]["completion_tokens"] == 3
