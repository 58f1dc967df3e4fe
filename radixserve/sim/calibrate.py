"""``radixserve sim calibrate --model DIR``: fit a CostModel to steps timed on the real runtime.

The real ``Scheduler`` with the real model runs requests built to give one kind of step at a
time, and each ``step()`` is timed whole (scheduling, forward, sampling, bookkeeping: what a
simulated step stands for), best of ``repeat``:

- prefill: ``n`` new tokens over a cached prefix of ``c`` (cached first by a request of its
  own), alone and as a batch of 4;
- decode: ``b`` requests at context ``L``, once all of them are running.

Then least squares with non-negative coefficients (:func:`radixserve.sim.cost_model.fit`).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Callable
from typing import Any

from radixserve.config import EngineConfig
from radixserve.runtime.io_struct import GenerateRequest
from radixserve.runtime.scheduler import Scheduler
from radixserve.sim.cost_model import CostModel, fit
from radixserve.types import SamplingParams

PREFILL_POINTS = ((16, 0), (64, 0), (256, 0), (512, 0), (64, 512), (256, 1024), (512, 1536))
PREFILL_BATCH_POINTS = ((4, 64, 0), (4, 128, 256))
DECODE_POINTS = ((1, 64), (4, 64), (16, 64), (32, 64), (1, 1024), (8, 1024), (32, 512))


class _Bench:
    def __init__(self, scheduler: Scheduler, low: int, high: int, seed: int) -> None:
        self.s = scheduler
        self.rng = random.Random(seed)
        self.low, self.high = low, high
        self._ids = itertools.count()

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(self.low, self.high) for _ in range(n)]

    def add(self, prompt: list[int], max_new: int) -> None:
        params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
        self.s.add_request(GenerateRequest(f"cal-{next(self._ids)}", prompt, params))

    def drain(self) -> None:
        while self.s.has_work:
            self.s.step()

    def timed_step(self) -> float:
        t0 = time.perf_counter()
        self.s.step()
        return time.perf_counter() - t0


def measure(
    scheduler: Scheduler,
    token_range: tuple[int, int],
    repeat: int = 2,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[tuple[list[int], list[int], float]], list[tuple[list[int], float]]]:
    """The timed prefill ``(extend_lens, prefix_lens, s)`` and decode ``(seq_lens, s)`` points."""
    b = _Bench(scheduler, *token_range, seed=0)
    say = progress or (lambda _: None)
    prefill: list[tuple[list[int], list[int], float]] = []
    b.add(b.ids(16), 2)  # warm up
    b.drain()
    for bs, n, c in [(1, n, c) for n, c in PREFILL_POINTS] + list(PREFILL_BATCH_POINTS):
        best = float("inf")
        for _ in range(repeat):
            scheduler.flush_cache()
            prefix = b.ids(c)
            if c:
                b.add(prefix + b.ids(1), 1)
                b.drain()
            for _ in range(bs):
                b.add(prefix + b.ids(n), 1)
            best = min(best, b.timed_step())
            b.drain()
        prefill.append(([n] * bs, [c] * bs, best))
        say(f"prefill {bs} x {n} new over {c} cached: {best * 1e3:.1f} ms")
    decode: list[tuple[list[int], float]] = []
    steps = 3
    for bs, ctx in DECODE_POINTS:
        scheduler.flush_cache()
        for _ in range(bs):
            b.add(b.ids(ctx), 2 + steps * repeat)
        while len(scheduler.running) < bs or scheduler.waiting:
            scheduler.step()
        times = [b.timed_step() for _ in range(steps * repeat)]
        # the context of the middle decode step (one token per step)
        decode.append(([ctx + 1 + steps] * bs, min(times)))
        say(f"decode {bs} at context {ctx}: {min(times) * 1e3:.1f} ms")
        b.drain()
    return prefill, decode


def calibrate(
    config: EngineConfig, repeat: int = 2, progress: Callable[[str], None] | None = None
) -> CostModel:
    """Load ``config``'s model, time the points, fit. Overlap is off: a step is timed whole."""
    from radixserve.bench.models import token_range

    model_path = config.model_path
    if model_path is None:
        raise ValueError("calibrate needs a model directory")
    config = config.replace(disable_overlap_schedule=True)
    scheduler = Scheduler(config)
    try:
        started = time.time()
        prefill, decode = measure(scheduler, token_range(model_path), repeat, progress)
    finally:
        scheduler.shutdown()
    meta: dict[str, Any] = {
        "source": "radixserve sim calibrate",
        "model": os.path.basename(os.path.normpath(model_path)),
        "dtype": config.dtype,
        "device": config.device,
        "num_threads": config.execution.num_threads,
        "chunked_prefill_size": config.admission.chunked_prefill_size,
        "loadavg_1m_at_start": os.getloadavg()[0],
        "measured_at_unix": started,
        # [batch size, new tokens, cached tokens, seconds] and [batch size, context, seconds]
        "prefill_points": [[len(e), e[0], p[0], t] for e, p, t in prefill],
        "decode_points": [[len(s), s[0], t] for s, t in decode],
    }
    return fit(prefill, decode, meta)
