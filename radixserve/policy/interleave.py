"""Prefill interleaving: a long prompt's chunks leave room for short prompts queued behind it.

With chunked prefill, the chunk of a continuing long prompt takes the whole chunk budget of
every step until that prompt is done, so every request queued behind it waits for all of its
chunks: a short request behind a 32k-token prompt waits 64 steps of 512 tokens (vLLM issues
31731 and 57413; SGLang's prefill interleaving is the remedy this follows). With
``enable_prefill_interleaving``, the continuing chunk is cut so that whole short prompts waiting
in the queue fit beside it in the same step:

- the first :data:`SCAN` waiting requests are scanned in the policy's order; a request is
  picked when its uncached prompt (in whole pages) is shorter than what the continuation has
  left and still fits in what the continuation can spare, everything above
  ``min_continuation`` (half the chunk budget by default);
- the picked ones are offered first (in their order), then the rest as they were;
- the continuation's chunk is the budget less what was picked. It always keeps
  ``min_continuation``, so the long prompt still advances every step.

So a short request behind a long prefill waits for one step, not for the whole prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixserve.types import Req

SCAN = 128  # requests looked at per pass (SGLang's bound, as its LPM fallback's)


def interleave(
    continuation_left: int,
    waiting: Sequence[Req],
    uncached: Callable[[Req], int],
    budget: int,
    page_size: int,
    min_continuation: int | None = None,
    rank: Callable[[Req], int] | None = None,
) -> tuple[int | None, list[Req]]:
    """The continuation's chunk limit (``None``: no cut, nothing picked) and the waiting
    requests in the order to offer them. ``continuation_left``: the tokens the continuing
    request still has to compute; ``uncached(req)``: what ``req`` would compute; ``budget``:
    the chunk budget of a step; ``rank``: with priority scheduling, each request's urgency
    class: the scan stops at the first request of another class than the first, so no request
    is moved ahead of a more urgent one."""
    floor = budget // 2 if min_continuation is None else min_continuation
    spare = (budget - floor) // page_size * page_size
    if spare <= 0 or not waiting:
        return None, list(waiting)
    picked: list[Req] = []
    reserved = 0
    first = rank(waiting[0]) if rank is not None else 0
    for req in waiting[:SCAN]:
        if rank is not None and rank(req) != first:
            break
        need = -(-uncached(req) // page_size) * page_size
        if 0 < need < continuation_left and reserved + need <= spare:
            picked.append(req)
            reserved += need
    if not picked:
        return None, list(waiting)
    chosen = set(picked)
    return budget - reserved, picked + [r for r in waiting if r not in chosen]
