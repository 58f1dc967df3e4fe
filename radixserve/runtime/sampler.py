"""Sampler: next tokens (and logprobs) from logits, batched over rows with different parameters.

The sampling semantics are in :mod:`radixserve.runtime.sampling_batch_info`. A draw inverts
the row's CDF at one uniform number (``searchsorted(cumsum(probs), u)``): no host sync, and one
random number per row instead of one per vocabulary entry (the exponential race of gpt-fast
costs ~4 ms per row for a 152k vocabulary on CPU, the CDF ~0.15 ms). A request with a ``seed``
draws its ``u`` from a generator seeded by ``(seed, number of output tokens so far)`` alone, so
its tokens depend neither on its batch mates nor on how steps were batched; unseeded rows use
the sampler's own generator. Top-p looks for its cutoff among the ``TOP_P_WIDTH`` most likely
tokens (a partial top-k, ~50x cheaper than sorting the vocabulary) and sorts only the rows
whose nucleus is wider than that.

Logprobs are ``log_softmax`` of the *raw* model logits (before a grammar's mask, penalties,
temperature and truncation), the same distribution as the prompt-token logprobs of
:class:`~radixserve.runtime.model_runner.LogitsOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.runtime.grammar.bitmask import apply_bitmask
from radixserve.runtime.sampling_batch_info import SamplingBatchInfo

_MASK = float("-inf")
TOP_P_WIDTH = 256  # topk(256) of [32, 152k] costs ~7 ms on one core, a full sort ~380 ms
_GOLDEN = 0x9E3779B97F4A7C15
_MIX = 0xBF58476D1CE4E5B9


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    """Device tensors; the caller converts them to lists once, after the step."""

    next_token_ids: torch.Tensor  # [bs] int64
    next_token_logprobs: torch.Tensor | None  # [bs] float32, when any row asked for logprobs
    top_logprobs: torch.Tensor | None  # [bs, max top_logprobs_num] float32, descending
    # [bs, max top_logprobs_num] int64; row i uses its first top_logprobs_nums[i]
    top_logprob_ids: torch.Tensor | None


class Sampler:
    """Stateless apart from the generator of unseeded rows (seeded by ``seed``)."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> SamplerOutput:
        """``logits`` ``[bs, vocab]`` (not modified) -> the next token of every row."""
        logits = logits.float()
        penalised = apply_penalties(_masked(logits, info), info)
        if info.all_greedy:
            ids = penalised.argmax(dim=-1)
        else:
            weights = self._weights(penalised, info)  # unnormalised; greedy rows one-hot
            cdf = weights.cumsum(dim=-1)  # [bs, vocab], non-decreasing
            u = self.uniform(info) * cdf[:, -1:]  # [bs, 1]
            # the first token whose CDF exceeds u; zero-probability tokens never are
            ids = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[-1] - 1)
        if not info.return_logprob:
            return SamplerOutput(ids, None, None, None)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
        k = max(info.top_logprobs_nums, default=0)
        if k == 0:
            return SamplerOutput(ids, chosen, None, None)
        top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        return SamplerOutput(ids, chosen, top.values, top.indices)

    def probs(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """The distribution each row samples from, ``[bs, vocab]`` float32: one-hot at the argmax
        of the penalised logits on greedy rows, else softmax(penalised logits / T) restricted by
        top-k, top-p and min-p and renormalised."""
        weights = self._weights(apply_penalties(_masked(logits.float(), info), info), info)
        return weights / weights.sum(dim=-1, keepdim=True)

    def _weights(self, x: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """Like :meth:`probs` on penalised logits ``x`` but not renormalised after truncation."""
        scaled = x / info.temperatures
        if info.need_top_k:
            scaled = _top_k(scaled, info)
        probs = torch.softmax(scaled, dim=-1)
        if info.need_top_p:
            probs = _top_p(probs, info)
        if info.need_min_p:  # relative to the largest, so unaffected by renormalisation
            threshold = info.min_ps.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < threshold, 0.0)
        if not info.any_greedy:
            return probs
        one_hot = torch.zeros_like(probs).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)
        return torch.where(info.is_greedy.unsqueeze(1), one_hot, probs)

    def uniform(self, info: SamplingBatchInfo, salt: int = 0) -> torch.Tensor:
        """``[bs, 1]`` uniform numbers in [0, 1); rows with a seed get their own stream (one per
        ``salt``: a verify's acceptance draws are independent of its token draws)."""
        u = torch.rand(info.batch_size, 1, device=self.device, generator=self.generator)
        for i, seed in enumerate(info.seeds):
            if seed is not None:
                step_seed = _step_seed(seed, info.steps[i]) ^ salt
                gen = torch.Generator(self.device).manual_seed(step_seed)
                u[i] = torch.rand(1, device=self.device, generator=gen)
        return u


def _masked(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """``logits`` with ``-inf`` on the tokens the rows' grammars forbid (a copy), or itself."""
    return logits if info.vocab_mask is None else apply_bitmask(logits, info.vocab_mask)


def apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """``logit_bias``, then repetition (prompt + output), then frequency and presence (output)
    penalties; returns a new tensor (or ``logits`` itself when no row has any)."""
    x = logits if info.logit_bias is None else logits + info.logit_bias
    if info.repetition_mask is not None and info.repetition_penalties is not None:
        rp = info.repetition_penalties
        penalised = torch.where(x > 0, x / rp, x * rp)
        x = torch.where(info.repetition_mask, penalised, x)
    if (
        info.output_counts is not None
        and info.frequency_penalties is not None
        and info.presence_penalties is not None
    ):
        counts = info.output_counts
        x = x - info.frequency_penalties * counts - info.presence_penalties * (counts > 0).float()
    return x


def _top_k(x: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Mask logits below each row's k-th largest (rows without top_k keep everything)."""
    k_max = info.max_top_k
    kth = x.topk(k_max, dim=-1).values.gather(1, (info.top_ks.clamp(max=k_max) - 1).unsqueeze(1))
    enabled = (info.top_ks < info.vocab_size).unsqueeze(1)
    return x.masked_fill(enabled & (x < kth), _MASK)


def _top_p(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero all but each row's smallest most-likely set whose mass reaches top_p (``probs`` sum
    to one per row, after top-k).

    The cutoff is searched among the ``width`` most likely tokens: ``max_top_k`` when every
    top-p row has a top_k (its nucleus cannot be wider), else ``TOP_P_WIDTH``; rows whose
    nucleus is wider than that (a flat distribution) fall back to a full sort.
    """
    vocab = probs.shape[-1]
    width = info.max_top_k if info.top_p_rows_have_top_k else max(TOP_P_WIDTH, info.max_top_k)
    width = min(width, vocab)
    top_ps = info.top_ps.unsqueeze(1)  # [bs, 1]
    sorted_p = probs.topk(width, dim=-1).values  # [bs, width], descending
    cutoff = _nucleus_cutoff(sorted_p, top_ps)
    if width < vocab:
        too_wide = (sorted_p.sum(dim=-1, keepdim=True) < top_ps).squeeze(1)
        if bool(too_wide.any()):  # rare on real models; a host sync on GPU
            rows = too_wide.nonzero().squeeze(1)
            full = probs[rows].sort(dim=-1, descending=True).values
            cutoff[rows] = _nucleus_cutoff(full, top_ps[rows])
    cutoff = cutoff.masked_fill(top_ps >= 1.0, 0.0)  # rows without top-p keep everything
    return probs.masked_fill(probs < cutoff, 0.0)


def _nucleus_cutoff(sorted_p: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """``[n, 1]``: the smallest probability kept, given each row's probabilities descending."""
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    num_keep = (mass_before < top_ps).sum(dim=-1, keepdim=True).clamp(min=1)
    return sorted_p.gather(1, num_keep - 1)


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit seed for draw ``step`` of the stream of ``seed`` (splitmix-style mixing)."""
    z = (seed * _GOLDEN + (step + 1) * _MIX) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * _MIX) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF
