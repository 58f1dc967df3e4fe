"""The mixed chunk (SGLang's ``--enable-mixed-chunk``): a prefill's forward that also computes
the running requests' next tokens, one each, as an extend of one token over each one's KV, so
they do not stand still while a new prompt is prefilled. The scheduler decides when
(``Scheduler._commit``: the flag, no speculation, nothing in flight); this lays the batch out."""

from __future__ import annotations

import torch

from radixserve.policy import Admission
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.schedule_batch import ScheduleBatch


def carry_running(
    admitted: list[Admission],
    slots: torch.Tensor,
    running: ScheduleBatch,
    kv: KVManager,
    max_context_len: int,
) -> tuple[list[Admission], torch.Tensor, int] | None:
    """The prefill ``admitted`` (over ``slots``) with ``running``'s next tokens after it: the
    forward's admissions, slots, and where the running requests begin. ``None`` (nothing
    allocated) where a request asks for logprobs (as SGLang) or has a grammar (its next tokens
    may be forced ones), or the pool cannot lend a slot each. ``running`` first drops the
    requests that are done; every running request's last token must be on the host."""
    reqs = [*(a.req for a in admitted), *running.reqs]
    if any(r.return_logprob or r.grammar is not None for r in reqs):
        return None
    running.drop_done(max_context_len)
    if not running or running.new_token_lens() is not None:
        return None
    carried = kv.alloc_decode(running.reqs)
    if carried is None:
        return None
    forward = [*admitted, *(Admission(r, None, 1) for r in running.reqs)]
    return forward, torch.cat([slots, carried]), len(admitted)
