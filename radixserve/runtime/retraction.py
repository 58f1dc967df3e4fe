"""Decode retraction (SGLang's ``retract_decode``) and the ``new_token_ratio`` it resets.

When a decode step cannot get a slot per running request even after the tree evicted what it
could, the scheduler sends requests back to the queue (their KV cached, or swapped to the tier)
until about ``retract_decode_steps`` more tokens each fit: the fewest generated tokens first,
then the longest prompts. ``NewTokenRatio`` is the share of each running request's remaining
``max_new_tokens`` an admission pass reserves: it decays after every step that decodes and is
set from the running batch after a retraction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixserve.config import SchedulerConstants
from radixserve.types import Req


def need(reqs: Sequence[Req], steps: int) -> int:
    """KV slots for ``steps`` more tokens each (a grammar's forced tokens, one extend, whole)."""
    return sum(max(r.seq_len - r.kv_len, steps) for r in reqs)


def retract(
    running: list[Req], available: Callable[[], int], send_back: Callable[[Req], None], steps: int
) -> None:
    """Send back requests of ``running`` (in the order above, one always stays) until
    ``available()`` slots cover :func:`need` of those left."""
    left = sorted(running, key=lambda r: (r.output_len, -r.prompt_len))  # victims first
    while len(left) > 1 and available() < need(left, steps):
        send_back(left.pop(0))


class NewTokenRatio:
    """SGLang's ``new_token_ratio`` (``value``), by the scheduler's constants."""

    def __init__(self, constants: SchedulerConstants) -> None:
        self.constants = constants
        self.value = constants.init_new_token_ratio

    def decay(self) -> None:
        """After each step that decodes."""
        c = self.constants
        step = (c.init_new_token_ratio - c.min_new_token_ratio) / c.new_token_ratio_decay_steps
        self.value = max(self.value - step, c.min_new_token_ratio)

    def after_retraction(self, running: Sequence[Req]) -> None:
        """What ``running`` decoded so far, plus ``retract_decode_steps`` each, of what it may."""
        steps = self.constants.retract_decode_steps
        decoded = sum(r.output_len for r in running)
        wanted = sum(r.max_new_tokens for r in running)
        self.value = min(1.0, (decoded + steps * len(running)) / max(wanted, 1))
