"""SamplingBatchInfo: the sampling parameters of a batch, as tensors, built once per step.

Semantics (what :class:`~radixserve.runtime.sampler.Sampler` applies, in this order):

0. the grammar's token bitmask (structured output): disallowed tokens get ``-inf``;
1. ``logit_bias`` (OpenAI's: added to the logits of its tokens), then penalties:
   - ``repetition_penalty`` (transformers/CTRL semantics) over every token that appears in the
     prompt *or* the output so far: a positive logit is divided by it, a negative one multiplied;
   - ``frequency_penalty`` and ``presence_penalty`` (OpenAI semantics) over the *output* tokens
     only: ``logit -= frequency_penalty * count + presence_penalty * (count > 0)``;
2. greedy rows (``temperature == 0`` or ``top_k == 1``) take the argmax of the penalised logits;
3. other rows: divide by ``temperature``, keep the ``top_k`` largest (ties at the k-th value are
   kept), then the smallest set of the most likely tokens whose renormalised mass reaches
   ``top_p``, then the tokens with probability >= ``min_p`` times the largest, and sample from
   the renormalised rest.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.runtime.grammar.bitmask import fill_batch_bitmask, fill_draft_bitmask
from radixserve.transfer import to_device, to_device_packed
from radixserve.types import Req, SamplingParams


@dataclass(eq=False, slots=True)
class SamplingBatchInfo:
    """Per-row parameters; build with :meth:`from_reqs` or :meth:`from_params`."""

    vocab_size: int
    temperatures: torch.Tensor  # [bs, 1] float32 (1.0 on greedy rows, which never divide by it)
    top_ks: torch.Tensor  # [bs] int64 (vocab_size where disabled)
    top_ps: torch.Tensor  # [bs] float32
    min_ps: torch.Tensor  # [bs] float32
    is_greedy: torch.Tensor  # [bs] bool
    # host-side flags, so the sampler skips whole stages without a device sync
    all_greedy: bool
    any_greedy: bool
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool
    max_top_k: int  # the largest enabled top_k (0 when none)
    top_p_rows_have_top_k: bool  # every row with top_p < 1 also has a top_k
    seeds: list[int | None]  # per-request seed (None: the sampler's own generator)
    steps: list[int]  # output tokens so far: which draw of its seeded stream a row takes
    # logit_bias and penalties, None when no row uses them
    logit_bias: torch.Tensor | None  # [bs, vocab] float32: added to the logits
    repetition_penalties: torch.Tensor | None  # [bs, 1] float32
    repetition_mask: torch.Tensor | None  # [bs, vocab] bool: token in prompt or output
    frequency_penalties: torch.Tensor | None  # [bs, 1] float32
    presence_penalties: torch.Tensor | None  # [bs, 1] float32
    output_counts: torch.Tensor | None  # [bs, vocab] float32: occurrences in the output
    # logprobs
    return_logprob: bool  # any row wants the chosen token's logprob
    top_logprobs_nums: list[int]  # per row, how many alternatives to return
    # structured output: [bs, ceil(vocab / 32)] int32 on the CPU, None when no row has a grammar
    vocab_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seeds)

    @classmethod
    def from_reqs(
        cls,
        reqs: Sequence[Req],
        vocab_size: int,
        device: torch.device | str = "cpu",
        drafts: Sequence[np.ndarray] | None = None,
    ) -> SamplingBatchInfo:
        """From scheduler requests (their params, prompt, output so far, logprob wishes and
        grammars: the mask is filled now, on the caller's thread). With ``drafts`` (a verify),
        request ``i`` has ``1 + len(drafts[i])`` rows, row ``j`` as if its first ``j`` drafted
        tokens were output already (penalties, grammar mask, the step of a seeded draw).

        A request whose own parameters cannot be turned into its row fails alone: it gets its
        ``Req.failure`` (the scheduler ends it at its result), its row samples with the
        defaults, and the batch runs on."""
        try:
            return cls._from_reqs(reqs, vocab_size, device, drafts)
        except Exception:
            for i, r in enumerate(reqs):  # find the requests at fault, one row each
                try:
                    cls._from_reqs([r], vocab_size, device, drafts and drafts[i : i + 1])
                except Exception as exc:
                    r.failure = exc
            if all(r.failure is None for r in reqs):
                raise  # no single request's: the batch's own failure
            rows = [r if r.failure is None else Req(rid=r.rid, origin_input_ids=[0]) for r in reqs]
            return cls._from_reqs(rows, vocab_size, device, drafts)

    @classmethod
    def _from_reqs(
        cls,
        reqs: Sequence[Req],
        vocab_size: int,
        device: torch.device | str,
        drafts: Sequence[np.ndarray] | None,
    ) -> SamplingBatchInfo:
        rows: list[Req] = list(reqs)
        outputs: list[Sequence[int]] = [r.output_ids for r in reqs]
        if drafts is not None:
            rows, outputs, steps = _draft_rows(reqs, drafts)
        info = cls.from_params(
            [r.sampling_params for r in rows],
            outputs,
            vocab_size,
            device,
            prompt_ids=[r.origin_input_ids for r in rows],
            return_logprob=[r.return_logprob for r in rows],
            top_logprobs_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in rows],
        )
        if drafts is None:
            info.vocab_mask = fill_batch_bitmask(reqs, vocab_size)
        else:
            info.vocab_mask = fill_draft_bitmask(reqs, drafts, vocab_size)
            info.steps = steps
        return info

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str = "cpu",
        prompt_ids: Sequence[Sequence[int]] | None = None,
        return_logprob: bool | Sequence[bool] = False,
        top_logprobs_nums: Sequence[int] | None = None,
    ) -> SamplingBatchInfo:
        """From parameters (validated once, at the edge: ``SamplingParams.validate``) and each
        row's output tokens so far (``prompt_ids`` only matter for ``repetition_penalty``)."""
        bs = len(params)
        if len(output_ids) != bs or (prompt_ids is not None and len(prompt_ids) != bs):
            raise ValueError("one output_ids (and prompt_ids) list per request is needed")
        greedy = [p.is_greedy for p in params]
        ks = [vocab_size if p.top_k == -1 or p.top_k >= vocab_size else p.top_k for p in params]
        sampled_rows = [i for i in range(bs) if not greedy[i]]
        need_top_k = any(ks[i] < vocab_size for i in sampled_rows)
        need_top_p = any(params[i].top_p < 1.0 for i in sampled_rows)
        need_min_p = any(params[i].min_p > 0.0 for i in sampled_rows)
        nums = list(top_logprobs_nums) if top_logprobs_nums is not None else [0] * bs
        if any(n < 0 for n in nums):
            raise ValueError("top_logprobs_num must be >= 0")
        flags = [return_logprob] * bs if isinstance(return_logprob, bool) else list(return_logprob)

        def col(values: list[float]) -> torch.Tensor:
            return to_device(values, device, torch.float32).view(bs, 1)

        info = cls(
            vocab_size=vocab_size,
            temperatures=col(
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)]
            ),
            top_ks=to_device(ks, device),
            top_ps=to_device([p.top_p for p in params], device, torch.float32),
            min_ps=to_device([p.min_p for p in params], device, torch.float32),
            is_greedy=to_device(greedy, device, torch.bool),
            all_greedy=not sampled_rows,
            any_greedy=any(greedy),
            need_top_k=need_top_k,
            need_top_p=need_top_p,
            need_min_p=need_min_p,
            max_top_k=max((ks[i] for i in sampled_rows if ks[i] < vocab_size), default=0),
            top_p_rows_have_top_k=all(
                ks[i] < vocab_size for i in sampled_rows if params[i].top_p < 1.0
            ),
            seeds=[p.seed for p in params],
            steps=[len(o) for o in output_ids],
            logit_bias=None,
            repetition_penalties=None,
            repetition_mask=None,
            frequency_penalties=None,
            presence_penalties=None,
            output_counts=None,
            return_logprob=any(flags) or any(n > 0 for n in nums),
            top_logprobs_nums=nums,
        )
        if any(p.logit_bias for p in params):
            info.logit_bias = _bias_table(params, vocab_size, device)
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = [
                list(o) if prompt_ids is None else list(prompt_ids[i]) + list(o)
                for i, o in enumerate(output_ids)
            ]
            info.repetition_penalties = col([p.repetition_penalty for p in params])
            info.repetition_mask = _token_table(seen, vocab_size, device, torch.bool)
        if any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params):
            info.frequency_penalties = col([p.frequency_penalty for p in params])
            info.presence_penalties = col([p.presence_penalty for p in params])
            info.output_counts = _token_table(output_ids, vocab_size, device, torch.float32)
        return info


class DecodeInfoCache:
    """The last decode batch's sampling info, built again only when the batch's requests change
    (which, or their order) or a row's sampling follows its output so far (penalties, a
    grammar's mask): otherwise a decode step changes only each row's draw index, ``steps``,
    which the caller sets. At 256 requests, building it was about a tenth of the scheduler's
    time per step (``benchmarks/scheduler_idle.py``)."""

    def __init__(self) -> None:
        self._reqs: list[Req] = []
        self._info: SamplingBatchInfo | None = None

    def get(self, reqs: list[Req], build: Callable[[], SamplingBatchInfo]) -> SamplingBatchInfo:
        """A copy of the cached info where it holds for ``reqs`` (the batch in flight keeps
        its own ``steps``), else ``build()``'s."""
        info = self._info
        same = len(reqs) == len(self._reqs) and all(map(operator.is_, reqs, self._reqs))
        if info is not None and same:
            return dataclasses.replace(info)
        info = build()
        keep = info.vocab_mask is None and info.repetition_mask is None
        keep = keep and info.output_counts is None and all(r.failure is None for r in reqs)
        self._reqs, self._info = (reqs, info) if keep else ([], None)
        return dataclasses.replace(info) if keep else info


def _draft_rows(
    reqs: Sequence[Req], drafts: Sequence[np.ndarray]
) -> tuple[list[Req], list[Sequence[int]], list[int]]:
    """A verify's rows: each request once per position; each row's output with the drafted
    tokens before it (whole lists only when a penalty of the batch counts them), and its
    length (the step of a seeded draw)."""
    rows = [r for r, d in zip(reqs, drafts, strict=True) for _ in range(1 + d.shape[0])]
    steps = [
        r.output_len + j for r, d in zip(reqs, drafts, strict=True) for j in range(1 + d.shape[0])
    ]
    if not any(_counts_tokens(r.sampling_params) for r in reqs):
        return rows, [()] * len(rows), steps
    outputs: list[Sequence[int]] = [
        [*r.output_ids, *d[:j].tolist()]
        for r, d in zip(reqs, drafts, strict=True)
        for j in range(1 + d.shape[0])
    ]
    return rows, outputs, steps


def _counts_tokens(p: SamplingParams) -> bool:
    return p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 or p.repetition_penalty != 1.0


def _bias_table(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """``[bs, vocab]`` float32: each row's ``logit_bias``, written in one indexed copy (a
    write per entry would cost every step microseconds per entry)."""
    rows = [row for row, p in enumerate(params) for _ in range(len(p.logit_bias or {}))]
    tokens = [token for p in params for token in (p.logit_bias or {})]
    values = [bias for p in params for bias in (p.logit_bias or {}).values()]
    table = torch.zeros(len(params), vocab_size, dtype=torch.float32)
    table[torch.tensor(rows), torch.tensor(tokens)] = torch.tensor(values, dtype=torch.float32)
    return to_device(table, device, torch.float32)


def _token_table(
    token_lists: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``[len(token_lists), vocab_size]``: occurrence counts (float) or presence (bool) per row."""
    rows = [i for i, toks in enumerate(token_lists) for _ in toks]
    cols = [t for toks in token_lists for t in toks]
    table = torch.zeros(len(token_lists), vocab_size, dtype=torch.float32, device=device)
    if cols:
        idx = tuple(to_device_packed([rows, cols], device))
        table.index_put_(idx, torch.ones(len(cols), device=device), accumulate=True)
    return table > 0 if dtype == torch.bool else table
