"""SGLang's ``/pause_generation`` and ``/continue_generation``: a scheduler loop that stops
stepping until told to go on (what RL trainers call between rollouts to update weights).

The modes are SGLang's (``PauseGenerationReqInput``):

- ``abort`` (the default): every request ends, aborted, and its client hears so at once;
- ``in_place``: the requests stay where they are, their KV kept, and go on after continue;
- ``retract``: the running requests (and a prefill in chunks) go back to the queue, what they
  computed cached in the tree as a retraction leaves it; after continue they are admitted again.

While paused no step runs: requests that arrive are queued and wait, aborts of queued requests
take effect at continue, and control calls (stats, cache flush, adapters) are answered. The
loops that drive a :class:`Scheduler` (``server/scheduler_process.py``, ``server/engine.py``)
each hold one :class:`Pause` and step only while :meth:`Pause.may_step`.
"""

from __future__ import annotations

from radixserve.runtime.io_struct import ReqOutput
from radixserve.runtime.scheduler import Scheduler

PAUSE_MODES = ("abort", "retract", "in_place")
_DRAIN_STEPS = 64  # aborted requests leave in a step or two (one more for a batch in flight)


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`PAUSE_MODES`, else ``ValueError`` naming them."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
    return mode


class Pause:
    def __init__(self) -> None:
        self.paused = False

    def may_step(self, scheduler: Scheduler) -> bool:
        return scheduler.has_work and not self.paused

    def pause(self, scheduler: Scheduler, mode: str = "abort") -> list[ReqOutput]:
        """Pause ``scheduler`` in ``mode`` (``ValueError`` for another); the outputs this
        produced (the aborted requests' last, results of a batch that was in flight), for the
        caller to send on as a step's."""
        check_mode(mode)
        outputs: list[ReqOutput] = []
        if mode == "abort":
            outputs += abort_all(scheduler)
        elif mode == "retract":
            retract_all(scheduler)
            outputs += scheduler.take_outputs()
        self.paused = True
        return outputs

    def resume(self) -> None:
        self.paused = False


def abort_all(scheduler: Scheduler) -> list[ReqOutput]:
    """End every request, aborted, and step until they are gone; their last outputs."""
    outputs: list[ReqOutput] = []
    for rid in list(scheduler.reqs):
        scheduler.abort_request(rid)
    for _ in range(_DRAIN_STEPS):
        if not scheduler.has_work:
            break
        outputs += scheduler.step()
    return outputs


def retract_all(scheduler: Scheduler) -> None:
    """Send every running request, and a prefill in chunks, back to the queue (the batch in
    flight processed first); each counts as a retraction."""
    scheduler.sync()
    scheduler.running.drop_done(scheduler.max_context_len)
    chunked, scheduler.chunked_req = scheduler.chunked_req, None
    for req in [*scheduler.running.reqs, *filter(None, [chunked])]:
        scheduler.send_back(req)
