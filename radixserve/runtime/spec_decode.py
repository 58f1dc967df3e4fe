"""SpecDecoder: the scheduler's speculative decoding (docs/speculative.md; docs/design.md,
"Speculative decoding").

Each decode step it is asked for drafts (:meth:`SpecDecoder.propose`): for every running
request, up to ``speculative_num_draft_tokens - 1`` tokens from the request's own text or the
tree's cached sequences in its namespace (``radixserve.spec``), as long as its recent
acceptance says (``DraftLength``), then as many as the cost model finds worth a wider forward
(``StepCosts``, measured on this machine at start: ``runtime/spec_calibrate.py``). With any,
the step is a VERIFY (``ScheduleBatch.verify``): the ``KVManager`` allocates ``1 + k`` slots
per request, the worker keeps the accepted prefix and the model's next
token (``runtime/spec_verify.py``), and :meth:`SpecDecoder.on_result` frees the rejected drafts'
KV (``KVManager.trim``) before anything reaches the tree. Without drafts it is a plain decode.

Every request drafts: one with a grammar drafts the tokens its grammar accepts (the draft is
cut at the first it refuses), and each verified position samples under its grammar's state
and its penalties' counts after the drafts before it (``runtime/spec_verify.py``).
:class:`NoSpec` is the null object when speculation is off.
"""

from __future__ import annotations

import numpy as np

from radixserve.config import EngineConfig
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.model_worker import BatchResult
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.runtime.scheduler_stats import SchedulerStats
from radixserve.runtime.spec_calibrate import measure_step_costs
from radixserve.spec import (
    NO_DRAFT,
    DraftLength,
    NgramDrafter,
    NgramParams,
    StepCosts,
    TreeDraftIndex,
)
from radixserve.types import Req


def verify_lens(drafts: list[np.ndarray] | None) -> list[int] | None:
    """Tokens each request computes in a verify of ``drafts``: its last one and its drafts."""
    return None if drafts is None else [1 + d.shape[0] for d in drafts]


class NoSpec:
    """Speculation off: every decode step is a plain one."""

    enabled = False

    def may_draft(self, reqs: list[Req]) -> bool:
        return False

    def propose(self, reqs: list[Req], available: int) -> list[np.ndarray] | None:
        return None

    def on_result(self, batch: ScheduleBatch, result: BatchResult) -> None:
        pass


class SpecDecoder:
    enabled = True

    def __init__(
        self,
        config: EngineConfig,
        kv: KVManager,
        max_context_len: int,
        stats: SchedulerStats,
        runner: ModelRunner | None = None,
    ) -> None:
        """``runner``: the model whose steps the cost model measures now (``None``, or
        ``--speculative-cost-model prior``: the prior)."""
        self.params = NgramParams(
            min_n=config.speculative.speculative_ngram_min_match_window_size,
            max_n=config.speculative.speculative_ngram_max_match_window_size,
            max_draft=config.speculative.speculative_num_draft_tokens - 1,
            capacity=config.speculative.speculative_ngram_capacity,
        )
        p = self.params
        index = None
        if not kv.tree.is_disabled:
            index = TreeDraftIndex(kv.tree.page_size, p.min_n, p.max_n, p.capacity)
            kv.tree.add_observer(index)
        self.drafter = NgramDrafter(p, index)
        self.cost = StepCosts.prior()
        if runner is not None and config.speculative.speculative_cost_model == "measured":
            max_bs = (
                config.speculative.speculative_ngram_max_batch_size
                or config.admission.max_running_requests
            )
            max_bs = min(max_bs, config.admission.max_running_requests)
            measured = measure_step_costs(runner, kv, max_bs, max_bs * (p.max_draft + 1))
            self.cost = measured or self.cost
        self.max_batch_size = config.speculative.speculative_ngram_max_batch_size
        self._may_draft: tuple[object, bool] = (None, False)  # (key, answer): see may_draft
        self.kv = kv
        self.max_context_len = max_context_len
        self.stats = stats

    @classmethod
    def of(
        cls,
        config: EngineConfig,
        kv: KVManager,
        max_context_len: int,
        stats: SchedulerStats,
        runner: ModelRunner | None = None,
    ) -> SpecDecoder | NoSpec:
        if config.speculative.speculative_algorithm is None:
            return NoSpec()
        return cls(config, kv, max_context_len, stats, runner)

    def may_draft(self, reqs: list[Req]) -> bool:
        """Whether a step of ``reqs`` could draft at all: no more of them than
        ``--speculative-ngram-max-batch-size``, and by the cost model a verify of every one's
        longest draft, each token certain to be accepted, beats the plain decode. Where not,
        the step is a plain decode whatever the texts, and the overlap loop need not wait for
        the step in flight (``runtime/overlap_wait.py``)."""
        return self._may_draft_over([r.seq_len for r in reqs])

    def _may_draft_over(self, contexts: list[int]) -> bool:
        """:meth:`may_draft` for requests of these contexts (their tokens so far)."""
        bs = len(contexts)
        if not bs or (self.max_batch_size is not None and bs > self.max_batch_size):
            return False
        # the answer kept while the batch size and the contexts' total to within about 1/16
        # hold (a plan over 256 requests takes about 0.2 ms)
        total = sum(contexts)
        shift = max(total.bit_length() - 5, 0)
        key = (bs, shift, total >> shift, self.cost)
        if key != self._may_draft[0]:
            certain = [[1.0] * self.params.max_draft] * bs
            self._may_draft = (key, any(self.cost.plan(certain, contexts)))
        return self._may_draft[1]

    def propose(self, reqs: list[Req], available: int) -> list[np.ndarray] | None:
        """Each request's drafts for the next step (empty where none pays), or ``None`` for a
        plain decode. ``available``: KV slots an allocation can get (drafts never crowd out a
        plain step)."""
        for req in reqs:
            if req.spec_verify_ct is None:
                req.spec_verify_ct = 0
                req.spec_state = DraftLength(self.params.max_draft)
        contexts = [r.seq_len for r in reqs]
        if not self._may_draft_over(contexts):  # no draft could pay: none is looked for
            return None
        drafted = [self._draft(r) for r in reqs]
        drafts = [d for d, _ in drafted]
        gains = [r.spec_state.gains(d.shape[0], m) for r, (d, m) in zip(reqs, drafted, strict=True)]
        counts = self.cost.plan(gains, contexts)
        page = self.kv.page_size
        if sum(counts) == 0 or sum(counts) + len(reqs) * (1 + page) > available:
            return None
        return [d[:c] for d, c in zip(drafts, counts, strict=True)]

    def on_result(self, batch: ScheduleBatch, result: BatchResult) -> None:
        """After a verify's tokens were applied: the rejected drafts' KV freed, the counters and
        each request's draft length updated."""
        verified = result.verified
        if not batch.is_verify or verified is None:
            return
        fb = batch.forward_batch
        assert fb is not None
        stats = self.stats
        stats.num_spec_verify_batches += 1
        for i, req in enumerate(batch.reqs):
            drafted, accepted = batch.drafts[i].shape[0], verified.num_accepted[i]
            before = fb.extend_prefix_lens_list[i] + 1  # its seq_len when the step began
            stats.num_generated_tokens += max(req.seq_len - before - 1, 0)
            # KV of its last token and the accepted drafts: the rest goes
            self.kv.trim(req, before + accepted)
            if drafted == 0:
                continue
            stats.on_verified(drafted, accepted)
            if req.spec_verify_ct is not None:
                req.spec_verify_ct += 1
            req.spec_accepted_tokens += accepted
            if isinstance(req.spec_state, DraftLength):
                req.spec_state.update(drafted, accepted)

    def _draft(self, req: Req) -> tuple[np.ndarray, int]:
        """Its draft, and the length of the match it follows."""
        if req.failure is not None:
            return NO_DRAFT.tokens, 0
        state: DraftLength = req.spec_state
        room = min(req.max_new_tokens - req.output_len, self.max_context_len - req.seq_len) - 1
        draft = self.drafter.draft(req.fill_ids, req.extra_key, min(state.limit, room))
        tokens = draft.tokens[: state.want(draft.match_len)]
        if req.grammar is not None and tokens.shape[0]:  # cut where the grammar refuses
            tokens = tokens[: req.grammar.draft_masks(tokens.tolist())]
        return tokens, draft.match_len
