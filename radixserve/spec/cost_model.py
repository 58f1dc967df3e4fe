"""VerifyCost: what one forward costs against the tokens it computes, and how many drafted
tokens are worth verifying.

A step of ``bs`` requests computing ``T`` tokens in all costs ``fixed + per_token * T``: the
fixed part streams the weights once (a decode at small batch is bound by it), each token adds
its compute. A plain decode computes ``T = bs`` tokens and yields ``bs``; a verify computes
``bs + K`` (``K`` drafted tokens) and yields ``bs + G``, ``G`` the drafts it accepts. Draft
tokens are taken in order of their expected gain (a request's ``j``-th draft is accepted with
probability ``rate ** j``) while each raises tokens per second::

    (bs + G + g) / (t + per_token) > (bs + G) / t   <=>   g * t > per_token * (bs + G)

So at batch 1 (``t`` is mostly the fixed part) drafts pay from a modest acceptance, and at a
large batch (``t`` is mostly compute already) only nearly certain ones do, or none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# per-token over fixed cost of a CPU step: radixserve's decode of the Qwen2.5-0.5B shape in bf16
# on a 2-core AVX-512 (VNNI) CPU, 2026-11-27, took 59 ms a step at b=1 and 111 ms at b=8. The
# prior until the machine's own figures are measured
DEFAULT_TOKEN_RATIO = 0.14


@dataclass(frozen=True, slots=True)
class VerifyCost:
    fixed_s: float = 1.0
    per_token_s: float = DEFAULT_TOKEN_RATIO

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_token_s <= 0:
            raise ValueError("a step's cost needs fixed_s >= 0 and per_token_s > 0")

    def step_s(self, num_tokens: int) -> float:
        return self.fixed_s + self.per_token_s * num_tokens

    def plan(self, gains: Sequence[Sequence[float]]) -> list[int]:
        """Per request, how many of its draft tokens to verify, given each one's expected gain
        (non-increasing along a request's draft: a token counts only with those before it)."""
        bs = len(gains)
        order = sorted(
            ((g, j, i) for i, row in enumerate(gains) for j, g in enumerate(row)),
            key=lambda c: (-c[0], c[1]),
        )
        counts = [0] * bs
        expected = 0.0
        t = self.step_s(bs)
        for g, j, i in order:
            if j != counts[i]:
                continue  # an earlier token of its draft was not taken
            if g * t <= self.per_token_s * (bs + expected):
                break  # gains only fall and the bar only rises from here
            counts[i] += 1
            expected += g
            t += self.per_token_s
        return counts
