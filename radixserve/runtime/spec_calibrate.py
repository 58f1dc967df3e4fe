"""Measuring :class:`StepCosts` on this machine at start, with the model and pools the server
will run (``--speculative-algorithm`` only; docs/speculative.md, "The cost model").

Plain decodes of 1, 2, 4, ... requests and verifies of 1, 2, 4, ... tokens run on scratch
request rows and KV slots, freed again before the first request; each size is timed a few
times and its fastest kept (what another process on the machine adds is noise, not cost). The
sizes stop growing once one step takes longer than :data:`STEP_BUDGET_S` (the tables extend
along their last segment past that: a step that long is compute already, linear in its
tokens). Two more pairs give the cost per token of context: a decode over a long context
against a short one, and a verify likewise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from radixserve.models.forward_batch import ForwardBatch
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.spec import StepCosts

logger = logging.getLogger(__name__)

REPEATS = 3
STEP_BUDGET_S = 0.4  # no larger size is measured past a step this long
MAX_VERIFY_TOKENS = 512
LONG_CONTEXT = 2048  # tokens of the context pair (fewer if the pool or the model is smaller)


def measure_step_costs(
    runner: ModelRunner, kv: KVManager, max_bs: int, max_tokens: int
) -> StepCosts | None:
    """The step costs of ``runner``'s model up to ``max_bs`` requests decoding and verifies of
    ``max_tokens`` tokens; ``None`` when the pools cannot lend the scratch space."""
    page = kv.page_size
    rows = kv.req_to_token_pool.alloc(max_bs)
    if rows is None:
        return None
    want = min(LONG_CONTEXT, kv.max_context_len // 2, kv.allocator.available_size() // 2)
    long_ctx = max(want - want % page, page)
    slots = kv.allocator.alloc(_round_up(max(max_bs * page, long_ctx + 16), page))
    if slots is None:
        kv.req_to_token_pool.free(rows)
        return None
    try:
        return _measure(_Scratch(runner, kv, rows, slots), max_bs, max_tokens, long_ctx)
    finally:
        kv.allocator.free(slots)
        kv.req_to_token_pool.free(rows)


def _round_up(n: int, page: int) -> int:
    return -(-n // page) * page


class _Scratch:
    """Scratch rows and slots; runs timed decodes and verifies over them."""

    def __init__(
        self, runner: ModelRunner, kv: KVManager, rows: list[int], slots: torch.Tensor
    ) -> None:
        self.runner, self.kv, self.rows, self.slots = runner, kv, rows, slots
        self.device = runner.device

    def decode_s(self, bs: int, context: int = 1) -> float:
        """A plain decode of ``bs`` requests, each over ``context`` tokens (bs 1 for a long
        context: it uses the slots one row would)."""
        page = self.kv.page_size
        for i in range(bs):
            start = i * page if context == 1 else 0
            self.kv.req_to_token_pool.write(self.rows[i], 0, self.slots[start : start + context])
        last = [i * page if context == 1 else context - 1 for i in range(bs)]
        batch = ForwardBatch.decode(
            [0] * bs, self.rows[:bs], [context] * bs, self.slots[last], self.device
        )
        return self._time(lambda: self.runner.forward(batch))

    def verify_s(self, tokens: int, prefix: int = 0) -> float:
        """A verify of ``tokens`` tokens of one request after ``prefix`` cached ones."""
        row = self.rows[0]
        self.kv.req_to_token_pool.write(row, 0, self.slots[: prefix + tokens])
        batch = ForwardBatch.verify(
            [0] * tokens,
            [row],
            [prefix],
            [tokens],
            self.slots[prefix : prefix + tokens],
            self.device,
        )
        return self._time(lambda: self.runner.forward(batch))

    def _time(self, step: Callable[[], object]) -> float:
        step()  # a first run of a shape may build what the later ones reuse
        best = float("inf")
        for _ in range(REPEATS):
            self._sync()
            start = time.perf_counter()
            step()
            self._sync()
            best = min(best, time.perf_counter() - start)
        return max(best, 1e-6)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _measure(scratch: _Scratch, max_bs: int, max_tokens: int, long_ctx: int) -> StepCosts:
    decode_sizes, decode_s = _table(scratch.decode_s, max_bs)
    max_tokens = min(max_tokens, MAX_VERIFY_TOKENS, long_ctx)
    verify_sizes, verify_s = _table(scratch.verify_s, max_tokens)
    short = min(8, max_tokens)
    decode_ctx = (scratch.decode_s(1, long_ctx) - scratch.decode_s(1)) / long_ctx
    verify_ctx = (scratch.verify_s(short, long_ctx - short) - scratch.verify_s(short)) / (
        short * (long_ctx - short)
    )
    costs = StepCosts(
        decode_sizes, decode_s, verify_sizes, verify_s, max(decode_ctx, 0.0), max(verify_ctx, 0.0)
    )
    logger.info(
        "speculative decoding's cost model: decode %s ms at batch %s; verify %s ms at %s tokens",
        _ms(decode_s),
        decode_sizes,
        _ms(verify_s),
        verify_sizes,
    )
    return costs


def _table(
    time_of: Callable[[int], float], largest: int
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Sizes 1, 2, 4, ... up to ``largest`` (and it), until a step outgrows the budget; the
    times made non-decreasing (a larger step never costs less)."""
    sizes: list[int] = []
    seconds: list[float] = []
    n = 1
    while True:
        sizes.append(n)
        seconds.append(max(time_of(n), seconds[-1] if seconds else 0.0))
        if n >= largest or seconds[-1] > STEP_BUDGET_S:
            break
        n = min(2 * n, largest)
    return tuple(sizes), tuple(seconds)


def _ms(seconds: tuple[float, ...]) -> list[float]:
    return [round(s * 1e3, 2) for s in seconds]
