"""A streamed Engine request caught running, for the tests of what pausing, aborting or updating
does to it: whether one is still running when the test acts is a race against the engine's
loop thread, which a busy machine can lose; this wins it by retrying, never by a clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from radixserve import Engine


@contextmanager
def paused_while_running(
    engine: Engine, params: dict[str, Any], mode: str = "in_place", attempts: int = 5, **kw: Any
) -> Iterator[tuple[list[int], Iterator[dict[str, Any]]]]:
    """``engine.generate(**kw, sampling_params=params, stream=True)`` paused in ``mode``
    (``in_place`` or ``retract``) after its first chunk, while it still runs: the ``with`` block
    gets the ids of that chunk and the stream's remaining chunks, with nothing stepping. A
    request that ended before the pause landed is sent again, up to ``attempts`` times. The
    engine continues on leaving the block."""
    for _ in range(attempts):
        stream = engine.generate(sampling_params=params, stream=True, **kw)
        first = list(next(stream)["output_ids"])
        before = engine.get_stats()["num_retractions"]
        engine.pause_generation(mode)
        try:
            stats = engine.get_stats()
            caught = (
                stats["num_running_reqs"] == 1
                if mode == "in_place"
                else stats["num_retractions"] == before + 1
            )
            if caught:
                yield first, stream
                return
        finally:
            engine.continue_generation()
        list(stream)  # it had finished: let it end, then try again
    raise AssertionError(f"no request was still running {attempts} times in a row")
