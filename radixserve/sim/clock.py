"""VirtualClock: the time source of a simulated run (the scheduler reads it as its clock)."""

from __future__ import annotations


class VirtualClock:
    """Seconds since the start of the run; moves only when the simulation says so.

    Pass the instance itself as ``Scheduler(..., clock=...)``: calling it reads the time.
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        if t < self.now:
            raise ValueError(f"a clock never goes back: {t} < {self.now}")
        self.now = t
