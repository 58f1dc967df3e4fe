"""PrefillAdder: which waiting requests join this pass's prefill batch (seed 004 sections 6-9).

Built once per scheduling pass. It reads free and evictable sizes and locks tree nodes; it never
allocates, frees or evicts. What the scheduler does with its outputs:

- ``can_run_list``: run these this pass; each computes ``fill_ids[prefix_len : prefix_len +
  extend_len]``. Each request admitted by ``add_one_req`` holds one tree lock, on
  ``req.last_node``, which the scheduler owns from then on: it moves it when it caches a chunk
  and releases it when the request finishes, aborts, is retracted or is preempted. The
  continuing chunked request keeps the lock it already had.
- ``new_chunked_req``: the request that is chunked after this pass, if any: the continuing one
  when chunks remain, or one admitted with a truncated first chunk (never two). Next pass it
  goes first, through ``add_chunked_req``.
- ``preempt_list``: running requests chosen by ``preempt_to_schedule``. The budget already counts
  their memory as free, so the scheduler frees them *after* the admission loop (freeing during
  it would count them twice), keeps their ``output_ids`` and puts them back in the queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixserve.config import SchedulerConstants
from radixserve.policy.ignore_eos import ignore_eos_fits, req_state
from radixserve.policy.preemption import outranks, victim_order
from radixserve.policy.prefill_budget import AddReqResult, FreeSlots, PrefillBudget
from radixserve.radix.base import PrefixCache
from radixserve.types import Req

__all__ = ["AddReqResult", "PrefillAdder"]


class PrefillAdder:
    """Admission for one pass; the budgets are in ``self.budget`` (:class:`PrefillBudget`)."""

    def __init__(
        self,
        page_size: int,
        tree_cache: PrefixCache,
        allocator: FreeSlots,
        running_reqs: Sequence[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
        max_new_reqs: int,
        constants: SchedulerConstants | None = None,
        enable_priority_scheduling: bool = False,
        schedule_low_priority_values_first: bool = False,
    ) -> None:
        self.tree_cache = tree_cache
        self.constants = constants if constants is not None else SchedulerConstants()
        self.running_reqs = [r for r in running_reqs if not r.is_finished]
        self.new_token_ratio = new_token_ratio
        self.enable_priority_scheduling = enable_priority_scheduling
        self.schedule_low_priority_values_first = schedule_low_priority_values_first
        self.budget = PrefillBudget(
            page_size,
            tree_cache,
            allocator,
            self.running_reqs,
            new_token_ratio,
            max_prefill_tokens,
            chunked_prefill_size,
            max_new_reqs,
            self.constants.clip_max_new_tokens,
        )
        self.can_run_list: list[Req] = []
        self.preempt_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self._running = set(self.running_reqs)
        self._admitted: set[Req] = set()

    @property
    def rem_total_tokens(self) -> float:
        return self.budget.rem_total_tokens

    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the chunked request of earlier passes; call first, before ``add_one_req``.

        Its next chunk is what is left, cut to the chunk budget (and to ``rem_total_tokens`` when
        that is smaller) in whole pages. When memory is short it still gets the full chunk budget:
        it already holds KV and a row, and stalling it would hold them forever. Takes no lock (it
        keeps its own) and no new slot. Returns ``req`` if more chunks remain (it is then also
        ``new_chunked_req``), else None.
        """
        budget = self.budget
        assert budget.rem_chunk_tokens is not None, "a chunked request without chunked prefill"
        ps = budget.page_size
        # what it computed so far: its cached prefix, or (no radix cache) its own KV
        extend_len = req.seq_len - max(req.prefix_len, req.kv_len)
        limit = min(budget.rem_chunk_tokens, int(budget.rem_total_tokens)) // ps * ps
        if limit <= 0:
            limit = budget.chunk_len()
        truncated = extend_len > limit
        req.extend_len = min(extend_len, limit)
        self.can_run_list.append(req)
        if truncated:
            self.new_chunked_req = req
        new_tokens = 0 if truncated else budget.new_tokens(req)
        budget.charge(budget.ceil_pages(req.extend_len), new_tokens, takes_slot=False)
        return req if truncated else None

    def add_one_req(self, req: Req, has_chunked_req: bool = False) -> AddReqResult:
        """Offer one waiting request; ``req.prefix_indices`` / ``last_node`` must come from a match
        made this pass. ``has_chunked_req=True`` forbids starting a chunked request (SGLang passes
        whether one continues); a second one never starts anyway.

        Refused when a running slot, the memory (``ceil_pages(extend) + min(max_new - generated,
        clip) >= rem_total_tokens``; for ``ignore_eos`` also ``ignore_eos_fits``) or, unless it
        is the first, the prefill budget is short. Locks ``req.last_node`` and re-checks under
        the lock (locking the prefix takes it out of ``evictable``). On refusal the lock is
        released and nothing changed. On admission the lock is kept, ``req.extend_len`` is set,
        and a request longer than the chunk budget becomes ``new_chunked_req`` with
        ``extend_len`` the chunk budget in whole pages (at least one page, else OTHER).
        """
        assert req not in self._admitted, "a request offered twice in one pass"
        budget = self.budget
        if budget.free_slots <= 0:
            return AddReqResult.OTHER
        extend_len = req.seq_len - req.prefix_len
        input_tokens = budget.ceil_pages(extend_len)
        total_tokens = input_tokens + budget.new_tokens(req)
        if total_tokens >= budget.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens >= budget.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER

        self.tree_cache.inc_lock_ref(req.last_node)
        refusal = self._refusal_under_lock(req, input_tokens, total_tokens, has_chunked_req)
        if refusal is not None:
            self.tree_cache.dec_lock_ref(req.last_node)
            return refusal
        if budget.needs_chunking(input_tokens):
            req.extend_len = budget.chunk_len()
            self.new_chunked_req = req
            budget.charge(req.extend_len, 0, takes_slot=True)
        else:
            req.extend_len = extend_len
            budget.charge(input_tokens, budget.new_tokens(req), takes_slot=True)
        self.can_run_list.append(req)
        self._admitted.add(req)
        return budget.state()

    def preempt_to_schedule(
        self, req: Req, running_reqs: Sequence[Req], has_chunked_req: bool = False
    ) -> bool:
        """Choose running requests to preempt so that ``req`` (just refused) fits.

        Only with priority scheduling on, and only victims that ``req`` outranks by more than
        ``constants.priority_preemption_threshold``, taken least urgent and most recent first,
        and only as many as needed to cover ``req``'s tokens and a running slot. If enough: the
        victims go to ``preempt_list``, the budget counts them as freed, and True:
        ``add_one_req(req)`` will then admit it. Otherwise nothing changes and False (also when
        ``req`` was admitted already or is refused for a reason preemption cannot lift). Only
        ``running_reqs`` that the adder was built with are considered. Frees nothing.
        """
        if not self.enable_priority_scheduling or req in self._admitted:
            return False
        budget = self.budget
        input_tokens = budget.ceil_pages(req.seq_len - req.prefix_len)
        total_tokens = input_tokens + budget.new_tokens(req)
        if input_tokens >= budget.rem_input_tokens and self.can_run_list:
            return False
        if budget.needs_chunking(input_tokens) and not self._may_start_chunk(has_chunked_req):
            return False
        taken = set(self.preempt_list)
        low_first = self.schedule_low_priority_values_first
        threshold = self.constants.priority_preemption_threshold
        candidates = [
            r
            for r in victim_order(running_reqs, low_first)
            if r in self._running and r not in taken
        ]
        self.tree_cache.inc_lock_ref(req.last_node)  # measure the budget as add_one_req will
        try:
            if self._fits(req, input_tokens, total_tokens):
                return False  # nothing to free: refused for another reason
            num_before, saved = len(self.preempt_list), budget.snapshot()
            for victim in candidates:
                if not outranks(req, victim, threshold, low_first):
                    break  # ordered by urgency: no later candidate is outranked either
                budget.credit(victim)
                self.preempt_list.append(victim)
                if self._fits(req, input_tokens, total_tokens):
                    return True
            del self.preempt_list[num_before:]
            budget.restore(saved)
            return False
        finally:
            self.tree_cache.dec_lock_ref(req.last_node)

    # ---- internals -----------------------------------------------------------------------
    def _refusal_under_lock(
        self, req: Req, input_tokens: int, total_tokens: int, has_chunked_req: bool
    ) -> AddReqResult | None:
        if total_tokens >= self.budget.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if req.sampling_params.ignore_eos and not self._ignore_eos_fits(req, input_tokens):
            return AddReqResult.NO_TOKEN
        if self.budget.needs_chunking(input_tokens) and not self._may_start_chunk(has_chunked_req):
            return AddReqResult.OTHER
        return None

    def _may_start_chunk(self, has_chunked_req: bool) -> bool:
        """A new chunked request needs: none other continuing, and a page of chunk budget."""
        return not has_chunked_req and self.new_chunked_req is None and self.budget.chunk_len() > 0

    def _fits(self, req: Req, input_tokens: int, total_tokens: int) -> bool:
        if self.budget.free_slots <= 0 or total_tokens >= self.budget.rem_total_tokens:
            return False
        return not req.sampling_params.ignore_eos or self._ignore_eos_fits(req, input_tokens)

    def _ignore_eos_fits(self, req: Req, input_tokens: int) -> bool:
        budget = self.budget
        if input_tokens > min(budget.cur_rem_tokens, budget.rem_total_tokens):
            return False
        taken = set(self.preempt_list)
        others = [r for r in self.running_reqs if r not in taken] + self.can_run_list
        states = [req_state(r, self.new_token_ratio) for r in [*others, req]]
        free_tokens = budget.cur_rem_tokens - input_tokens
        return ignore_eos_fits(states, free_tokens, self.constants.ignore_eos_reserve_tokens)
