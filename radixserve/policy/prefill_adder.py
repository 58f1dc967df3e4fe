"""PrefillAdder: which waiting requests join this pass's prefill batch (SGLang's ``PrefillAdder``,
``python/sglang/srt/managers/schedule_policy.py``; docs/design.md, "Scheduling").

Built once per scheduling pass from the frozen :class:`AdmissionConfig` and the pass's state.
It decides; it never allocates, frees or evicts, and writes no KV field of a request. What it
returns is a :class:`PrefillPlan` (data), which the ``KVManager`` commits all or nothing:

- ``admitted``: run these this pass, each computing ``extend_len`` tokens after its match.
  Each new admission holds one tentative tree lock, on ``match.last_node``, that the plan
  carries (``prefill_plan`` says who takes it over). The continuing chunked request keeps the
  lock it already had.
- ``chunked``: the request that is chunked after this pass, if any: the continuing one when
  chunks remain, or one admitted with a truncated first chunk (never two). Next pass it goes
  first, through ``add_chunked_req``.
- ``to_preempt``: running requests chosen by ``preempt_to_schedule``. The budget already counts
  their memory as free, so the scheduler frees them *after* the admission loop (freeing during
  it would count them twice), keeps their ``output_ids`` and puts them back in the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from radixserve.config import AdmissionConfig
from radixserve.policy.ignore_eos import ReqState, ignore_eos_fits, req_state
from radixserve.policy.interleave import interleave
from radixserve.policy.preemption import outranks, victim_order
from radixserve.policy.prefill_budget import AddReqResult, KVView, PrefillBudget
from radixserve.policy.prefill_plan import Admission, PrefillPlan
from radixserve.policy.prefix_match import match_req_prefix
from radixserve.policy.sort_keys import urgency
from radixserve.policy.swap_admission import AllocStatus, can_swap_in
from radixserve.radix.base import MatchResult
from radixserve.types import Req

__all__ = ["AddReqResult", "PrefillAdder"]


class PrefillAdder:
    """Admission for one pass; the budgets are in ``self.budget`` (:class:`PrefillBudget`)."""

    def __init__(
        self,
        config: AdmissionConfig,
        kv: KVView,
        running_reqs: Sequence[Req],
        new_token_ratio: float,
        max_new_reqs: int,
    ) -> None:
        self.config = config
        self.constants = config.constants
        self.kv = kv
        self.tree_cache = kv.tree
        self.running_reqs = [r for r in running_reqs if not r.is_finished]
        self.new_token_ratio = new_token_ratio
        self.budget = PrefillBudget(config, kv, self.running_reqs, new_token_ratio, max_new_reqs)
        self.result = PrefillPlan()
        self._running = set(self.running_reqs)
        self._admitted: set[Req] = set()
        self._matches: dict[Req, MatchResult] = {}
        # each request's (tokens_left, tokens_occupied) of this pass: nothing it reads changes
        # while a pass plans, and the ignore_eos check reads every running request per offer
        self._eos_states: dict[Req, ReqState] = {}

    # ---- the pass ------------------------------------------------------------------------
    def plan(
        self,
        waiting_queue: Sequence[Req],
        matches: Mapping[Req, MatchResult] | None = None,
        deprioritized: frozenset[str] = frozenset(),
        chunked_req: Req | None = None,
        gate: Callable[[Req, Sequence[Req]], bool] | None = None,
    ) -> PrefillPlan:
        """Admission for one pass: ``chunked_req`` continues first, then ``waiting_queue``
        (already ordered by ``SchedulePolicy.calc_priority``) is offered in order.

        ``matches``: the policy's matches of this pass; a request without one is matched just
        before it is offered. A refused request may preempt running ones (priority scheduling);
        the loop stops at the first request that is refused and cannot preempt, so no request
        overtakes a refused one. ``deprioritized`` (``Ordering.deprioritized``): once something is
        admitted, these wait for the next pass, when the prefix they share with an admitted request
        is cached (in-batch prefix deprioritization). SGLang only moves them to the back, so with
        room they join the same batch and recompute it. ``gate(req, admitted)``: may ``req`` join
        the requests admitted so far (the runtime's LoRA adapters per batch)? The pass stops at the
        first it refuses, as at any refusal.
        """
        has_chunked_req = chunked_req is not None
        matches = matches or {}
        queue: Sequence[Req] = waiting_queue
        if chunked_req is not None:
            limit = None
            if self.config.enable_prefill_interleaving:
                matches = dict(matches)  # the scan matches the requests it looks at
                limit, queue = self._interleave(chunked_req, waiting_queue, matches)
            self.add_chunked_req(chunked_req, limit)
        for req in queue:
            if req.rid in deprioritized and self.result.admitted:
                continue
            if gate is not None and not gate(req, self.result.reqs):
                break
            self.add_one_req(req, has_chunked_req, matches.get(req))
            if req in self._admitted:
                continue
            if not self.preempt_to_schedule(req, has_chunked_req):
                break
            self.add_one_req(req, has_chunked_req, self._matches[req])
            assert req in self._admitted, "preemption promised room for the request"
        return self.result

    # ---- views of the plan so far ---------------------------------------------------------
    @property
    def can_run_list(self) -> list[Req]:
        return self.result.reqs

    @property
    def new_chunked_req(self) -> Req | None:
        return self.result.chunked

    @property
    def preempt_list(self) -> list[Req]:
        return self.result.to_preempt

    @property
    def rem_total_tokens(self) -> float:
        return self.budget.rem_total_tokens

    def extend_len(self, req: Req) -> int:
        """The tokens ``req`` computes this pass (it must be admitted)."""
        return next(a.extend_len for a in self.result.admitted if a.req is req)

    def match_of(self, req: Req) -> MatchResult:
        """The match ``req`` was offered with this pass."""
        return self._matches[req]

    # ---- offering ------------------------------------------------------------------------
    def add_chunked_req(self, req: Req, cap: int | None = None) -> Req | None:
        """Continue the chunked request of earlier passes; call first, before ``add_one_req``.

        Its next chunk is what is left, cut to the chunk budget (and to ``rem_total_tokens`` when
        that is smaller, and to ``cap``: prefill interleaving) in whole pages. When memory is
        short it still gets the full chunk budget: it already holds KV and a row, and stalling
        it would hold them forever. Takes no lock (it
        keeps its own) and no new slot. Returns ``req`` if more chunks remain (it is then also
        ``chunked``), else None.
        """
        budget = self.budget
        assert budget.rem_chunk_tokens is not None, "a chunked request without chunked prefill"
        ps = budget.page_size
        # what it computed so far: its cached prefix, or (no radix cache) its own KV
        extend_len = req.seq_len - max(req.prefix_len, req.kv_len)
        limit = min(budget.rem_chunk_tokens, int(budget.rem_total_tokens)) // ps * ps
        if cap is not None:
            limit = min(limit, cap // ps * ps)
        if limit <= 0:
            limit = budget.chunk_len()
        truncated = extend_len > limit
        extend_len = min(extend_len, limit)
        self.result.admitted.append(Admission(req, None, extend_len))
        if truncated:
            self.result.chunked = req
        new_tokens = 0 if truncated else budget.new_tokens(req)
        budget.charge(budget.ceil_pages(extend_len), new_tokens, takes_slot=False)
        return req if truncated else None

    def add_one_req(
        self, req: Req, has_chunked_req: bool = False, match: MatchResult | None = None
    ) -> AddReqResult:
        """Offer one waiting request with its ``match`` of this pass (None: match it now).
        ``has_chunked_req=True`` forbids starting a chunked request (SGLang passes whether one
        continues); a second one never starts anyway.

        Refused when a running slot, the memory (``ceil_pages(extend) + min(max_new - generated,
        clip) >= rem_total_tokens``; for ``ignore_eos`` also ``ignore_eos_fits``) or, unless it
        is the first, the prefill budget is short. Locks ``match.last_node`` and re-checks under
        the lock (locking the prefix takes it out of ``evictable``). On refusal the lock is
        released and nothing changed. On admission the lock is kept (in the plan), and a request
        longer than the chunk budget becomes ``chunked`` with the chunk budget in whole pages
        (at least one page, else OTHER).
        """
        assert req not in self._admitted, "a request offered twice in one pass"
        if match is None:
            match = match_req_prefix(req, self.tree_cache)
        self._matches[req] = match
        budget = self.budget
        if budget.free_slots <= 0:
            return AddReqResult.OTHER
        extend_len = req.seq_len - match.cached_len
        input_tokens = budget.ceil_pages(extend_len)
        load = match.tier_len  # slots a load-back from the KV tier takes (no compute)
        total_tokens = input_tokens + load + budget.new_tokens(req)
        if total_tokens >= budget.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if req.swap_node is not None and self._swap_in_later(total_tokens):
            return AddReqResult.NO_TOKEN
        if input_tokens >= budget.rem_input_tokens and self.result.admitted:
            return AddReqResult.OTHER

        self.tree_cache.inc_lock_ref(match.last_node)
        refusal = self._refusal_under_lock(req, input_tokens, load, total_tokens, has_chunked_req)
        if refusal is not None:
            self.tree_cache.dec_lock_ref(match.last_node)
            return refusal
        if budget.needs_chunking(input_tokens):
            extend_len = budget.chunk_len()
            self.result.chunked = req
            budget.charge(extend_len, 0, takes_slot=True, load_tokens=load)
        else:
            budget.charge(input_tokens, budget.new_tokens(req), takes_slot=True, load_tokens=load)
        self.result.admitted.append(Admission(req, match, extend_len))
        self._admitted.add(req)
        return budget.state()

    def preempt_to_schedule(self, req: Req, has_chunked_req: bool = False) -> bool:
        """Choose running requests to preempt so that ``req`` (just refused by ``add_one_req``,
        whose match it reuses) fits.

        Only with priority scheduling on, and only victims that ``req`` outranks by more than
        ``constants.priority_preemption_threshold``, taken least urgent and most recent first,
        and only as many as needed to cover ``req``'s tokens and a running slot. If enough: the
        victims go to ``to_preempt``, the budget counts them as freed, and True:
        ``add_one_req(req)`` will then admit it. Otherwise nothing changes and False (also when
        ``req`` was admitted already or is refused for a reason preemption cannot lift). Only
        the running requests the adder was built with are considered. Frees nothing.
        """
        if not self.config.enable_priority_scheduling or req in self._admitted:
            return False
        match = self._matches.get(req) or match_req_prefix(req, self.tree_cache)
        self._matches[req] = match
        budget = self.budget
        input_tokens = budget.ceil_pages(req.seq_len - match.cached_len)
        load = match.tier_len
        total_tokens = input_tokens + load + budget.new_tokens(req)
        if input_tokens >= budget.rem_input_tokens and self.result.admitted:
            return False
        if budget.needs_chunking(input_tokens) and not self._may_start_chunk(has_chunked_req):
            return False
        taken = set(self.result.to_preempt)
        low_first = self.config.schedule_low_priority_values_first
        threshold = self.constants.priority_preemption_threshold
        candidates = [
            r
            for r in victim_order(self.running_reqs, low_first)
            if r in self._running and r not in taken
        ]
        self.tree_cache.inc_lock_ref(match.last_node)  # measure the budget as add_one_req will
        try:
            if self._fits(req, input_tokens + load, total_tokens):
                return False  # nothing to free: refused for another reason
            victims = self.result.to_preempt
            num_before, saved = len(victims), budget.snapshot()
            for victim in candidates:
                if not outranks(req, victim, threshold, low_first):
                    break  # ordered by urgency: no later candidate is outranked either
                budget.credit(victim)
                victims.append(victim)
                if self._fits(req, input_tokens + load, total_tokens):
                    return True
            del victims[num_before:]
            budget.restore(saved)
            return False
        finally:
            self.tree_cache.dec_lock_ref(match.last_node)

    # ---- internals -----------------------------------------------------------------------
    def _refusal_under_lock(
        self, req: Req, input_tokens: int, load: int, total_tokens: int, has_chunked_req: bool
    ) -> AddReqResult | None:
        if total_tokens >= self.budget.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if req.sampling_params.ignore_eos and not self._ignore_eos_fits(req, input_tokens + load):
            return AddReqResult.NO_TOKEN
        if self.budget.needs_chunking(input_tokens) and not self._may_start_chunk(has_chunked_req):
            return AddReqResult.OTHER
        return None

    def _swap_in_later(self, total_tokens: int) -> bool:
        """A swapped-out request waits (LATER) while coming back would dig into the watermark;
        one the watermark alone would shut out forever (NEVER) is left to the budget check:
        ``Scheduler.add_request`` checked that it fits the pool."""
        status = can_swap_in(total_tokens, self.budget.rem_total_tokens, self.kv.capacity)
        return status is AllocStatus.LATER

    def _interleave(
        self, chunked: Req, waiting: Sequence[Req], matches: dict[Req, MatchResult]
    ) -> tuple[int | None, Sequence[Req]]:
        """The continuation's chunk cap and the queue's order (``policy/interleave.py``)."""
        budget = self.budget.rem_chunk_tokens
        if budget is None:
            return None, waiting

        def uncached(req: Req) -> int:
            match = matches.get(req)
            if match is None:
                match = matches[req] = match_req_prefix(req, self.tree_cache)
            return req.seq_len - match.cached_len

        left = chunked.seq_len - max(chunked.prefix_len, chunked.kv_len)
        floor = self.config.prefill_interleaving_min_continuation_tokens
        low_first = self.config.schedule_low_priority_values_first
        rank = (
            (lambda r: urgency(r.priority, low_first))
            if self.config.enable_priority_scheduling
            else None
        )
        return interleave(left, waiting, uncached, budget, self.budget.page_size, floor, rank)

    def _may_start_chunk(self, has_chunked_req: bool) -> bool:
        """A new chunked request needs: none other continuing, and a page of chunk budget."""
        return not has_chunked_req and self.result.chunked is None and self.budget.chunk_len() > 0

    def _fits(self, req: Req, input_tokens: int, total_tokens: int) -> bool:
        """``input_tokens``: the slots it needs now (computed and loaded back)."""
        if self.budget.free_slots <= 0 or total_tokens >= self.budget.rem_total_tokens:
            return False
        return not req.sampling_params.ignore_eos or self._ignore_eos_fits(req, input_tokens)

    def _ignore_eos_fits(self, req: Req, input_tokens: int) -> bool:
        budget = self.budget
        if input_tokens > min(budget.cur_rem_tokens, budget.rem_total_tokens):
            return False
        taken = set(self.result.to_preempt)
        others = [r for r in self.running_reqs if r not in taken] + self.can_run_list
        memo, ratio = self._eos_states, self.new_token_ratio
        states = []
        for r in [*others, req]:
            state = memo.get(r)
            if state is None:
                state = memo[r] = req_state(r, ratio)
            states.append(state)
        free_tokens = budget.cur_rem_tokens - input_tokens
        return ignore_eos_fits(states, free_tokens, self.constants.ignore_eos_reserve_tokens)
