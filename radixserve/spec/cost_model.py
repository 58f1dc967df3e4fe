"""StepCosts: what a decode step and a verify step cost on this machine, and which drafted
tokens are worth verifying.

A plain decode of ``bs`` requests yields ``bs`` tokens; a verify that computes ``bs + K`` tokens
(``K`` drafted) yields ``bs + G``, ``G`` the drafts it accepts. Their times come from tables
measured at start (``runtime/spec_calibrate.py``): a decode against its batch size, a verify
against the tokens it computes (its linear layers and the lm_head run on every one), each plus
what attention costs over the requests' contexts: per token of each request's context (read
once for the request, as a decode reads it), and for a verify, a little more per drafted token
(each drafted query reads it too, mostly from cache). Between the measured sizes the tables are
interpolated, past the last one extended along its last segment.

:meth:`StepCosts.plan` takes draft tokens in order of their expected gain (a request's
``j``-th draft is accepted with probability about ``rate ** j``) per the time each adds, and
keeps the number of them with the most tokens per second, if that beats the plain decode's;
otherwise none. A verify replayed from a CUDA graph costs its graph's time whatever it drafts
(``graph_sizes``): there a draft adds only what its attention reads of the context. So at
batch 1, where a step is mostly streaming the weights once, drafts pay from a modest
acceptance; at a large batch, where a step is compute already, only nearly certain ones do,
or none; and a request with a long context, whose every drafted token reads all of it, drafts
less than a short one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The prior until a machine is measured (and for model-free tests): a token's cost 0.14 of a
# step's fixed cost, radixserve's decode of the Qwen2.5-0.5B shape in bf16 on a 2-core AVX-512
# (VNNI) CPU (59 ms a step at b=1, 111 ms at b=8)
DEFAULT_TOKEN_RATIO = 0.14


def _interp(sizes: Sequence[int], seconds: Sequence[float], n: float) -> float:
    """``seconds`` at ``n`` by the table: linear between sizes, along the last segment past
    the end, the first value below the start."""
    i = bisect.bisect_left(sizes, n)
    if i < len(sizes) and sizes[i] == n:
        return seconds[i]
    if i == 0:
        return seconds[0]
    if i == len(sizes):
        if len(sizes) == 1:
            return seconds[0] * n / sizes[0]
        i -= 1
    x0, x1, y0, y1 = sizes[i - 1], sizes[i], seconds[i - 1], seconds[i]
    return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


def _interp_many(sizes: Sequence[int], seconds: Sequence[float], ns: np.ndarray) -> np.ndarray:
    """:func:`_interp` at each of ``ns`` (the same float operations, so the same values)."""
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    n = ns.astype(np.float64)
    i = np.searchsorted(x, n, side="left")
    last = len(sizes) - 1
    hit = x[np.minimum(i, last)] == n
    if last == 0:
        out = np.where(n < x[0], y[0], y[0] * n / x[0])
    else:
        j = np.clip(i, 1, last)
        x0, x1, y0, y1 = x[j - 1], x[j], y[j - 1], y[j]
        out = np.where(i == 0, y[0], y0 + (y1 - y0) * (n - x0) / (x1 - x0))
    return np.where(hit, y[np.minimum(i, last)], out)


def _check_table(name: str, sizes: Sequence[int], seconds: Sequence[float]) -> None:
    if not sizes or len(sizes) != len(seconds):
        raise ValueError(f"{name}: one time per size, at least one")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)) or sizes[0] < 1:
        raise ValueError(f"{name}: sizes must be >= 1 and ascending")
    if any(s <= 0 for s in seconds):
        raise ValueError(f"{name}: times must be > 0")


@dataclass(frozen=True, slots=True)
class StepCosts:
    """``decode_s[i]``: seconds of a plain decode of ``decode_sizes[i]`` requests;
    ``verify_s[i]``: of a verify computing ``verify_sizes[i]`` tokens (both over contexts of
    about one token). ``decode_context_s`` and ``verify_context_s``: seconds per token of a
    request's context, in a decode and in a verify; ``draft_context_s``: per drafted token per
    token of its request's context, in a verify."""

    decode_sizes: tuple[int, ...]
    decode_s: tuple[float, ...]
    verify_sizes: tuple[int, ...]
    verify_s: tuple[float, ...]
    decode_context_s: float = 0.0
    verify_context_s: float = 0.0
    draft_context_s: float = 0.0
    # verifies replayed from CUDA graphs (runtime/verify_graph.py): seconds of one by its
    # graph's size in requests, whatever it drafts (a graph computes its padding too); a batch
    # of up to the last size takes the smallest size that holds it. Empty: no graphs
    graph_sizes: tuple[int, ...] = ()
    graph_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _check_table("decode", self.decode_sizes, self.decode_s)
        _check_table("verify", self.verify_sizes, self.verify_s)
        if self.graph_sizes or self.graph_s:
            _check_table("graph", self.graph_sizes, self.graph_s)
        if min(self.decode_context_s, self.verify_context_s, self.draft_context_s) < 0:
            raise ValueError("context costs must be >= 0")

    @classmethod
    def prior(cls, token_ratio: float = DEFAULT_TOKEN_RATIO) -> StepCosts:
        """A step costs ``1 + token_ratio * tokens`` (decode or verify alike), whatever the
        context."""
        sizes = (1, 1024)
        seconds = tuple(1.0 + token_ratio * n for n in sizes)
        return cls(sizes, seconds, sizes, seconds)

    def decode(self, bs: int, context: int) -> float:
        """Seconds of a plain decode of ``bs`` requests whose contexts hold ``context``
        tokens in all."""
        return _interp(self.decode_sizes, self.decode_s, bs) + self.decode_context_s * context

    def verify(self, tokens: int, context: int, drafted_context: int = 0) -> float:
        """Seconds of a verify computing ``tokens`` tokens of requests whose contexts hold
        ``context`` tokens in all; ``drafted_context``: the sum over the drafted tokens of
        their request's context."""
        return _interp(self.verify_sizes, self.verify_s, tokens) + self._context_s(
            context, drafted_context
        )

    def verify_step(self, bs: int, drafted: int, context: int, drafted_context: int = 0) -> float:
        """Seconds of a verify of ``bs`` requests and ``drafted`` drafts: a graph's where one
        holds ``bs`` requests, else :meth:`verify` of ``bs + drafted`` tokens; plus the
        context terms either way."""
        graph = self._graph(bs)
        if not graph:
            return self.verify(bs + drafted, context, drafted_context)
        return graph + self._context_s(context, drafted_context)

    def _context_s(self, context: Any, drafted_context: Any) -> Any:
        """A verify's seconds of attention over the contexts: ``context`` tokens in all, and
        ``drafted_context`` summed over its drafted tokens (numbers, or arrays of them)."""
        return self.verify_context_s * context + self.draft_context_s * drafted_context

    def _graph(self, bs: int) -> float:
        """Seconds of a verify graph holding ``bs`` requests; 0.0 where none does."""
        i = bisect.bisect_left(self.graph_sizes, bs)
        return self.graph_s[i] if i < len(self.graph_sizes) else 0.0

    def plan(self, gains: Sequence[Sequence[float]], contexts: Sequence[int]) -> list[int]:
        """Per request, how many of its draft tokens to verify, given each one's expected
        gain (non-increasing along a request's draft: a token counts only with those before
        it) and each request's context (its tokens so far). All zeros when no choice beats
        the plain decode."""
        bs = len(gains)
        if bs == 0:
            return []
        # a token's marginal time: the table's slope (about the same for every request; none
        # in a graph, which computes its padding anyway) plus the context its attention reads;
        # tokens go in order of gain per marginal time (a request's later tokens after its
        # earlier ones: their gains are no larger)
        graph = self._graph(bs)
        slope = 0.0 if graph else (self.verify(2 * bs + 1, 0) - self.verify(bs, 0)) / (bs + 1)
        ctx = np.asarray(contexts, dtype=np.int64)
        cost = np.maximum(slope + self.draft_context_s * ctx, 1e-12)
        lens = np.fromiter((len(row) for row in gains), dtype=np.int64, count=bs)
        total = int(lens.sum())
        if total == 0:
            return [0] * bs
        g = np.fromiter((x for row in gains for x in row), dtype=np.float64, count=total)
        req = np.repeat(np.arange(bs), lens)
        pos = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)  # j within its draft
        order = np.lexsort((pos, -g / cost[req]))  # stable: ties keep request order
        taken = req[order]
        context = int(ctx.sum())
        drafted_context = np.cumsum(ctx[taken])
        if graph:
            table = np.full(total, graph)
        else:
            table = _interp_many(self.verify_sizes, self.verify_s, bs + np.arange(1, total + 1))
        verify = table + self._context_s(context, drafted_context)
        rates = (bs + np.cumsum(g[order])) / verify
        best = int(rates.argmax())
        plan = [0] * bs
        if rates[best] <= bs / self.decode(bs, context):
            return plan
        for i in taken[: best + 1].tolist():
            plan[i] += 1
        return plan
