"""Verifying drafts: which drafted tokens a VERIFY forward accepts, and the model's next token.

Row ``t`` of a verify's logits follows token ``t`` of the batch: for a request with drafts
``d_1 .. d_k`` its ``k + 1`` rows are the distributions ``p_0 .. p_k`` the model would sample
the request's next ``k + 1`` tokens from, had each draft before been sampled. Acceptance keeps
the output distribution exactly (rejection sampling against a deterministic draft): draft
``d_{j+1}`` is accepted with probability ``p_j(d_{j+1})``; at the first rejection the token is
drawn from ``p_j`` with ``d_{j+1}`` removed and renormalised (``p_j(x) / (1 - p_j(d))``), and
when all ``k`` are accepted from ``p_k``. So each output token has law ``p_j`` whatever the
draft. Greedy rows (``p`` one-hot at the argmax) accept exactly the drafts equal to the argmax,
then take the argmax: the tokens of decoding without drafts.

``p_j`` is the sampler's own distribution (``Sampler.probs``: grammar mask, logit bias,
penalties, temperature, top-k/p, min-p) from the request's parameters at output step
``output_len + j``, as if ``d_1 .. d_j`` were output already: the penalties count them, the
grammar's mask is its state after them (``ReqGrammar.draft_masks``).
A seeded request draws its numbers from ``(seed, step)`` streams: without drafts its token is
the one plain decoding would sample.
"""

from __future__ import annotations

import torch

from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_batch_info import SamplingBatchInfo
from radixserve.runtime.schedule_batch import ScheduleBatch

ACCEPT_SALT = 0x5EC0_ACCE  # the acceptance draws' own seeded streams


def verify_sampling_info(
    batch: ScheduleBatch, vocab_size: int, device: torch.device
) -> SamplingBatchInfo:
    """One row per verified token: row ``j`` of a request samples as its output step
    ``output_len + j`` would after its first ``j`` drafted tokens (their penalties counted,
    its grammar advanced by them)."""
    return SamplingBatchInfo.from_reqs(batch.reqs, vocab_size, device, batch.drafts)


class VerifyResult:
    """Per request (host lists): ``tokens`` (its accepted drafts, then the model's next token),
    ``num_accepted``, and with logprobs asked for, each token's ``logprobs`` and
    ``top_logprobs`` (of the raw logits at its row, as a plain step reports them)."""

    __slots__ = ("tokens", "num_accepted", "logprobs", "top_logprobs")

    def __init__(self, bs: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(bs)]
        self.num_accepted = [0] * bs
        self.logprobs: list[list[float]] = [[] for _ in range(bs)]
        self.top_logprobs: list[list[list[tuple[int, float]]]] = [[] for _ in range(bs)]


def accept_drafts(
    sampler: Sampler, logits: torch.Tensor, batch: ScheduleBatch, info: SamplingBatchInfo
) -> VerifyResult:
    """``logits`` ``[num_tokens, vocab]`` of a VERIFY forward -> what each request keeps."""
    lens = [1 + d.shape[0] for d in batch.drafts]
    num_rows = sum(lens)
    # the draft each row judges (-1: a request's last row, which judges none)
    judged = torch.full((num_rows,), -1, dtype=torch.int64)
    offsets = []
    row = 0
    for draft, n in zip(batch.drafts, lens, strict=True):
        offsets.append(row)
        judged[row : row + n - 1] = torch.from_numpy(draft).to(torch.int64)
        row += n
    judged = judged.to(logits.device)
    has = judged >= 0
    probs = sampler.probs(logits, info)  # [rows, vocab]
    p_draft = probs.gather(1, judged.clamp(min=0).unsqueeze(1)).squeeze(1)
    if info.all_greedy:
        accept = has & (p_draft > 0.5)
        choice = probs.argmax(dim=-1)
    else:
        accept = has & (sampler.uniform(info, ACCEPT_SALT).squeeze(1) < p_draft)
        residual = probs.scatter(1, judged.clamp(min=0).unsqueeze(1), 0.0)
        residual = torch.where(has.unsqueeze(1), residual, probs)
        # p(d) == 1 leaves nothing: such a row is never rejected, so never drawn from
        total = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(total > 0, residual, probs)
        cdf = residual.cumsum(dim=-1)
        u = sampler.uniform(info) * cdf[:, -1:]
        choice = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[-1] - 1)
    accepted, chosen = accept.tolist(), choice.tolist()
    out = VerifyResult(len(lens))
    rows: list[int] = []  # the logits row of every kept token, request after request
    for i, (draft, n, first) in enumerate(zip(batch.drafts, lens, offsets, strict=True)):
        a = 0
        while a < n - 1 and accepted[first + a]:
            a += 1
        out.num_accepted[i] = a
        out.tokens[i] = draft[:a].tolist() + [chosen[first + a]]
        rows.extend(range(first, first + a + 1))
    if info.return_logprob:
        _logprobs(logits, info, out, rows)
    return out


def _logprobs(
    logits: torch.Tensor, info: SamplingBatchInfo, out: VerifyResult, rows: list[int]
) -> None:
    rows_t = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    tokens = torch.tensor([t for ts in out.tokens for t in ts], device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, rows_t), dim=-1)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    k = max(info.top_logprobs_nums, default=0)
    top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1) if k else None
    values = top.values.tolist() if top is not None else []
    ids = top.indices.tolist() if top is not None else []
    pos = 0
    for i, ts in enumerate(out.tokens):
        out.logprobs[i] = chosen[pos : pos + len(ts)]
        for r in range(pos, pos + len(ts)):
            num = info.top_logprobs_nums[rows[r]]
            out.top_logprobs[i].append(list(zip(ids[r][:num], values[r][:num], strict=True)))
        pos += len(ts)
