"""ReqGrammar: a request's grammar state, and the forced text it has yet to emit.

Where the grammar forces text (the keys and punctuation of a JSON schema), the request emits
its canonical tokenization (the matcher's ``forced_tokens``), computed once, right after each
freely sampled token. With jump-forward the scheduler appends all of them in one extend step
(:meth:`take_forced`); without it, each step's mask admits only the next one. Both modes thus
emit the same tokens: jump-forward saves the decode steps, never changes the output.

With ``after_token`` (a reasoning block's ``</think>``), the grammar waits: every token is
allowed until that one is emitted, and the grammar constrains what follows it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.runtime.grammar.backend import GrammarMatcher


class ReqGrammar:
    """Owned by the scheduler thread (the worker never touches it, see
    ``docs/structured_output.md``); ``num_accepted`` always equals the request's output tokens
    it has seen, so a retracted or preempted request is rebuilt by :meth:`sync_to`."""

    def __init__(self, matcher: GrammarMatcher, after_token: int | None = None) -> None:
        self.matcher = matcher
        self.after_token = after_token
        self.waiting = after_token is not None  # the grammar starts after after_token
        self.num_accepted = 0
        self.forced: list[int] = self._compute_forced()

    def accept(self, token: int) -> None:
        """Advance by an emitted token (sampled under this grammar's mask, or forced)."""
        if self._advance(token) is None:
            raise AssertionError(f"token {token} was sampled outside its grammar")

    def _advance(self, token: int) -> int | None:
        """Advance by ``token``: ``None`` if the grammar refuses it (state unchanged), else the
        tokens the matcher took (0 while the grammar waits)."""
        if self.waiting:
            self.waiting = token != self.after_token
            self.num_accepted += 1
            self.forced = self._compute_forced()
            return 0
        if not self.matcher.accept_token(token):
            return None
        self.num_accepted += 1
        if self.forced and token == self.forced[0]:
            del self.forced[0]
        else:  # a free choice: what the grammar forces next starts here
            self.forced = self._compute_forced()
        return 1

    def draft_masks(
        self, draft: Sequence[int], bitmask: torch.Tensor | None = None, first_row: int = 0
    ) -> int:
        """Walk a speculative ``draft`` without keeping it: how many of its leading tokens the
        grammar accepts in a row. With ``bitmask``, row ``first_row + j`` gets the mask after
        ``draft[:j]``, for ``j`` up to that count (each verified position's mask). The state
        afterwards is the state before."""
        saved = (self.waiting, self.num_accepted, list(self.forced))
        taken = accepted = 0
        try:
            for token in draft:
                if bitmask is not None:
                    self.fill_bitmask(bitmask, first_row + accepted)
                step = self._advance(token)
                if step is None:
                    break
                taken += step
                accepted += 1
            if bitmask is not None:
                self.fill_bitmask(bitmask, first_row + accepted)
        finally:
            if taken:
                self.matcher.rollback(taken)
            self.waiting, self.num_accepted, self.forced = saved
        return accepted

    def take_forced(self, limit: int) -> list[int]:
        """Jump forward: up to ``limit`` pending forced tokens, accepted now (the caller appends
        them to the output and computes their KV in one extend step)."""
        tokens = self.forced[: max(limit, 0)]
        for token in tokens:
            self.accept(token)
        return tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.waiting:
            bitmask[row] = -1  # every token: the grammar has not started
        elif self.forced:
            token = self.forced[0]
            bitmask[row].zero_()
            bitmask[row, token // 32] = _bit(token % 32)
        else:
            self.matcher.fill_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return not self.waiting and self.matcher.is_terminated()

    def sync_to(self, output_ids: Sequence[int]) -> None:
        """Make the state that of ``output_ids`` (after a retraction, preemption or any path
        that may have dropped tokens): a no-op when it already is."""
        if self.num_accepted == len(output_ids):
            return
        self.matcher.reset()
        self.waiting = self.after_token is not None
        self.num_accepted = 0
        self.forced = self._compute_forced()
        for token in output_ids:
            self.accept(token)

    def _compute_forced(self) -> list[int]:
        if self.waiting or self.matcher.is_terminated():
            return []
        return list(self.matcher.forced_tokens())


def _bit(i: int) -> int:
    """Bit ``i`` of an int32 word (bit 31 is the sign bit)."""
    return (1 << i) - (1 << 32) if i == 31 else 1 << i
