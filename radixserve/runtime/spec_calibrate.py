"""Measuring :class:`StepCosts` on this machine at start, with the model and pools the server
will run (``--speculative-algorithm`` only; docs/speculative.md, "The cost model").

Plain decodes of 1, 2, 4, ... requests and verifies of 1, 2, 4, ... tokens run on scratch
request rows and KV slots, freed again before the first request; every size is timed in each
of a few rounds over all of them and its fastest kept (what another process on the machine
adds is noise, not cost, and a busy moment slows one round rather than one size). A step is
timed with what follows its forward on the worker (a decode's sampling; a verify's
distribution per row, which acceptance reads: over a large vocabulary that is a cost per
token too); the scheduler's own work per step, about the same either way, is left out, which
makes a verify look a little dearer than it is (the model errs toward not drafting). The
sizes stop growing once one step takes longer than :data:`STEP_BUDGET_S` (the tables extend
along their last segment past that: a step that long is compute already, linear in its
tokens). Three more pairs give what attention costs over a context: a decode of one request
over a long context against a short one, a verify of one token likewise (a request's context,
read once), and a verify of several tokens (the extra per drafted token). With verify graphs
(``--cuda-graph-verify``), a verify of each graph's size in requests, one token each: what a
verify of that many requests costs whatever it drafts.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import torch

from radixserve.models.forward_batch import ForwardBatch
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_batch_info import SamplingBatchInfo
from radixserve.spec import StepCosts
from radixserve.types import SamplingParams

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
    """Scratch rows and slots; builds decode and verify steps over them and times them."""

    def __init__(
        self, runner: ModelRunner, kv: KVManager, rows: list[int], slots: torch.Tensor
    ) -> None:
        self.runner, self.kv, self.rows, self.slots = runner, kv, rows, slots
        self.device = runner.device
        self.sampler = Sampler(device=runner.device)

    def _greedy(self, rows: int) -> SamplingBatchInfo:
        params = [SamplingParams(temperature=0.0)] * rows
        return SamplingBatchInfo.from_params(
            params, [()] * rows, self.runner.vocab_size, self.device
        )

    def decode(self, bs: int, context: int = 1) -> Callable[[], object]:
        """A plain decode of ``bs`` requests, each over ``context`` tokens (bs 1 for a long
        context: it uses the slots one row would)."""
        page = self.kv.page_size
        starts = [i * page if context == 1 else 0 for i in range(bs)]
        last = [start + context - 1 for start in starts]
        batch = ForwardBatch.decode(
            [0] * bs, self.rows[:bs], [context] * bs, self.slots[last], self.device
        )

        info = self._greedy(bs)

        def step() -> object:  # the forward and the sampling after it, as a step runs them
            for row, start in zip(self.rows, starts, strict=False):
                self.kv.req_to_token_pool.write(row, 0, self.slots[start : start + context])
            return self.sampler(self.runner.forward(batch).next_token_logits, info)

        return step

    def verify(self, tokens: int, prefix: int = 0) -> Callable[[], object]:
        """A verify of ``tokens`` tokens of one request after ``prefix`` cached ones."""
        row, end = self.rows[0], prefix + tokens
        batch = ForwardBatch.verify(
            [0] * tokens, [row], [prefix], [tokens], self.slots[prefix:end], self.device
        )

        info = self._greedy(tokens)

        def step() -> object:  # the forward and each row's distribution (acceptance reads it)
            self.kv.req_to_token_pool.write(row, 0, self.slots[:end])
            logits = self.runner.forward(batch).next_token_logits
            return self.sampler.probs(logits, info).argmax(dim=-1)

        return step

    def verify_rows(self, bs: int) -> Callable[[], object]:
        """A verify of ``bs`` requests of one token each: a verify graph of their size costs
        that whatever they draft (each drafted row's distribution after it is left out)."""
        page = self.kv.page_size
        starts = [i * page for i in range(bs)]
        batch = ForwardBatch.verify(
            [0] * bs, self.rows[:bs], [0] * bs, [1] * bs, self.slots[starts], self.device
        )
        info = self._greedy(bs)

        def step() -> object:
            for row, start in zip(self.rows, starts, strict=False):
                self.kv.req_to_token_pool.write(row, 0, self.slots[start : start + 1])
            logits = self.runner.forward(batch).next_token_logits
            return self.sampler.probs(logits, info).argmax(dim=-1)

        return step

    def time(self, step: Callable[[], object]) -> float:
        self._sync()
        start = time.perf_counter()
        step()
        self._sync()
        return max(time.perf_counter() - start, 1e-6)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _measure(scratch: _Scratch, max_bs: int, max_tokens: int, long_ctx: int) -> StepCosts:
    max_tokens = min(max_tokens, MAX_VERIFY_TOKENS, long_ctx)
    short = min(8, max_tokens)
    steps: dict[tuple[str, int], Callable[[], object]] = {}
    for n in _sizes(scratch, scratch.decode, max_bs):
        steps["decode", n] = scratch.decode(n)
    for n in _sizes(scratch, scratch.verify, max_tokens):
        steps["verify", n] = scratch.verify(n)
    steps.setdefault(("verify", short), scratch.verify(short))  # the context pairs' short sides
    steps["decode long", 1] = scratch.decode(1, long_ctx)
    steps["verify long", 1] = scratch.verify(1, long_ctx - short)
    steps["verify long", short] = scratch.verify(short, long_ctx - short)
    graphs = scratch.runner.verify_graphs
    for n in graphs.sizes if graphs is not None else []:
        if n <= len(scratch.rows):
            steps["graph", n] = scratch.verify_rows(n)
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(REPEATS):  # rounds over every step: a busy moment slows one round, not a size
        for key, step in steps.items():
            best[key] = min(best[key], scratch.time(step))
    decode = _table(best, "decode")
    verify = _table(best, "verify")
    prefix = long_ctx - short
    decode_ctx = max((best["decode long", 1] - best["decode", 1]) / long_ctx, 0.0)
    # a request's context, read for its first token, and the extra per drafted token
    verify_ctx = max((best["verify long", 1] - best["verify", 1]) / prefix, 0.0)
    per_token = (best["verify long", short] - best["verify", short]) / prefix
    draft_ctx = max((per_token - verify_ctx) / max(short - 1, 1), 0.0)
    graph = _table(best, "graph") if any(k == "graph" for k, _ in best) else ((), ())
    costs = StepCosts(*decode, *verify, decode_ctx, verify_ctx, draft_ctx, *graph)
    logger.info(
        "speculative decoding's cost model: decode %s ms at batch %s; verify %s ms at %s tokens",
        _ms(decode[1]),
        decode[0],
        _ms(verify[1]),
        verify[0],
    )
    return costs


def _sizes(
    scratch: _Scratch, make: Callable[[int], Callable[[], object]], largest: int
) -> list[int]:
    """Sizes 1, 2, 4, ... up to ``largest`` (and it), until a step outgrows the budget (each
    run once first: a first run of a shape may build what later ones reuse)."""
    sizes, n = [], 1
    while True:
        sizes.append(n)
        step = make(n)
        step()
        if n >= largest or scratch.time(step) > STEP_BUDGET_S:
            return sizes
        n = min(2 * n, largest)


def _table(
    best: dict[tuple[str, int], float], kind: str
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The sizes of ``kind`` and their fastest times, made non-decreasing (a larger step
    never costs less)."""
    sizes = sorted(n for k, n in best if k == kind)
    seconds = list(itertools.accumulate((best[kind, n] for n in sizes), max))
    return tuple(sizes), tuple(seconds)


def _ms(seconds: tuple[float, ...]) -> list[float]:
    return [round(s * 1e3, 2) for s in seconds]
