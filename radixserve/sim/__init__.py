"""``radixserve sim``: replay a trace through the real scheduling code on a virtual clock.

The real ``Scheduler``, ``SchedulePolicy``, ``PrefillAdder``, ``RadixCache`` and ``KVManager``
run around a model worker that computes nothing (:class:`SimWorker`): each batch costs what a
:class:`CostModel` says, and that time passes on a :class:`VirtualClock` the scheduler reads
instead of the wall clock. N replicas may sit behind a router policy of sglang-router.
"""

from radixserve.sim.clock import VirtualClock
from radixserve.sim.cost_model import CostModel
from radixserve.sim.sim_worker import SimWorker

__all__ = ["CostModel", "SimWorker", "VirtualClock"]
