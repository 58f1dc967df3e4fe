"""PrefillBudget: the token and slot budgets of one admission pass (SGLang's ``PrefillAdder``)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from radixserve.config import AdmissionConfig
from radixserve.policy.preemption import freeable_tokens
from radixserve.radix.base import PrefixCache
from radixserve.types import Req


class AddReqResult(enum.Enum):
    """The budget after a call: keep offering (CONTINUE), out of KV memory (NO_TOKEN), or out of
    another budget (OTHER: prefill tokens, chunk, running slots). A request is admitted iff it
    was appended to ``can_run_list``; the result may say that the budget is now spent."""

    CONTINUE = enum.auto()
    NO_TOKEN = enum.auto()
    OTHER = enum.auto()


class KVView(Protocol):
    """What admission reads of the KV memory (the ``KVManager`` is one).

    ``capacity``: the pool's usable slots. ``available_size()``: free slots plus what evicting
    the tree would free, read live, so a lock taken on ``tree`` shows at once. ``tree``: for
    matching and the admission's tentative locks (see ``prefill_plan``); admission never
    allocates, frees or evicts.
    """

    @property
    def tree(self) -> PrefixCache: ...

    @property
    def capacity(self) -> int:
        """Usable slots of the pool."""
        ...

    def available_size(self) -> int: ...


class PrefillBudget:
    """Budgets in tokens. ``available`` and ``evictable`` are read live from the :class:`KVView`,
    so a lock taken on the tree shows at once.

    - ``rem_total_tokens = available + evictable - reserved - admitted``: ``reserved`` sums
      ``min(max_new - generated, clip_max_new_tokens) * new_token_ratio`` over the running
      requests; ``admitted`` sums the page-rounded inputs plus ``min(max_new - generated, clip)``
      of the requests admitted this pass (no decode tokens for a truncated chunk).
    - ``cur_rem_tokens = available + evictable - inputs admitted``: memory needed right now.
    - ``rem_input_tokens`` starts at ``max_prefill_tokens``, ``rem_chunk_tokens`` at
      ``chunk_size`` (None: no chunking); ``free_slots`` at ``max_new_reqs``.
    - A preemption victim is credited its ``freeable_tokens``, its reservation and its slot.
    """

    def __init__(
        self,
        config: AdmissionConfig,
        kv: KVView,
        running_reqs: Sequence[Req],
        new_token_ratio: float,
        max_new_reqs: int,
    ) -> None:
        self.page_size = kv.tree.page_size
        self.kv = kv
        self.new_token_ratio = new_token_ratio
        self.clip_max_new_tokens = config.constants.clip_max_new_tokens
        self.rem_input_tokens = config.max_prefill_tokens
        self.rem_chunk_tokens = config.chunk_size
        self.free_slots = max_new_reqs
        self._total_offset = float(sum(self.reserved(r) for r in running_reqs))
        self._cur_offset = 0.0

    @property
    def rem_total_tokens(self) -> float:
        return self._free_and_evictable() - self._total_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._free_and_evictable() - self._cur_offset

    def state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or self.free_slots <= 0:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    # ---- per-request quantities ----------------------------------------------------------
    def new_tokens(self, req: Req) -> int:
        """Decode tokens budgeted for ``req``: what is left of ``max_new_tokens``, clipped."""
        return min(req.remaining_new_tokens(), self.clip_max_new_tokens)

    def reserved(self, req: Req) -> float:
        """What a running request keeps reserved for its decoding."""
        return self.new_tokens(req) * self.new_token_ratio

    def ceil_pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size) * self.page_size

    def needs_chunking(self, input_tokens: int) -> bool:
        return self.rem_chunk_tokens is not None and input_tokens > self.rem_chunk_tokens

    def chunk_len(self) -> int:
        """The longest chunk that fits the chunk budget, in whole pages."""
        if self.rem_chunk_tokens is None:
            return 0
        return self.rem_chunk_tokens // self.page_size * self.page_size

    # ---- updates -------------------------------------------------------------------------
    def charge(
        self, input_tokens: int, new_tokens: int, takes_slot: bool, load_tokens: int = 0
    ) -> None:
        """``input_tokens`` computed now, ``load_tokens`` loaded back from the KV tier (memory
        but no prefill budget), ``new_tokens`` of decoding reserved."""
        self._total_offset += input_tokens + load_tokens + new_tokens
        self._cur_offset += input_tokens + load_tokens
        self.rem_input_tokens -= input_tokens
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= input_tokens
        self.free_slots -= takes_slot

    def credit(self, victim: Req) -> None:
        """Count a preemption victim's memory and slot as free."""
        freed = freeable_tokens(victim)
        self._total_offset -= freed + self.reserved(victim)
        self._cur_offset -= freed
        self.free_slots += 1

    def snapshot(self) -> tuple[float, float, int]:
        return self._total_offset, self._cur_offset, self.free_slots

    def restore(self, snapshot: tuple[float, float, int]) -> None:
        self._total_offset, self._cur_offset, self.free_slots = snapshot

    def _free_and_evictable(self) -> int:
        return self.kv.available_size()
