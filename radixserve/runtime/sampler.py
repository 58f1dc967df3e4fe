"""Sampler: next tokens (and logprobs) from logits, batched over rows with different parameters.

The sampling semantics are in :mod:`radixserve.runtime.sampling_batch_info`. Draws use the
exponential-race form of categorical sampling (``argmax(probs / E)`` with ``E ~ Exp(1)``, as in
gpt-fast), which needs no host sync. A request with a ``seed`` draws its noise from a generator
seeded by ``(seed, number of output tokens so far)`` alone, so its tokens do not depend on its
batch mates nor on how steps were batched; unseeded rows use the sampler's own generator.

Logprobs are ``log_softmax`` of the *raw* model logits (before penalties, temperature and
truncation), the same distribution as the prompt-token logprobs of
:class:`~radixserve.runtime.model_runner.LogitsOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.runtime.sampling_batch_info import SamplingBatchInfo

_MASK = float("-inf")
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
        penalised = apply_penalties(logits, info)
        if info.all_greedy:
            ids = penalised.argmax(dim=-1)
        else:
            probs = self.probs(penalised, info, penalties_applied=True)
            noise = self._noise(info)
            ids = (probs / noise).argmax(dim=-1)  # greedy rows are one-hot in probs
        if not info.return_logprob:
            return SamplerOutput(ids, None, None, None)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
        k = max(info.top_logprobs_nums, default=0)
        if k == 0:
            return SamplerOutput(ids, chosen, None, None)
        top = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        return SamplerOutput(ids, chosen, top.values, top.indices)

    def probs(
        self, logits: torch.Tensor, info: SamplingBatchInfo, penalties_applied: bool = False
    ) -> torch.Tensor:
        """The distribution each row samples from, ``[bs, vocab]`` float32: one-hot at the argmax
        on greedy rows, else softmax(logits / T) restricted by top-k, top-p and min-p and
        renormalised. Penalties are applied first unless ``penalties_applied``."""
        x = logits.float() if penalties_applied else apply_penalties(logits.float(), info)
        greedy_ids = x.argmax(dim=-1, keepdim=True)
        x = x / info.temperatures
        if info.need_top_k:
            x = _top_k(x, info)
        if info.need_top_p:
            x = _top_p(x, info)
        probs = torch.softmax(x, dim=-1)
        if info.need_min_p:
            threshold = info.min_ps.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < threshold, 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        if not info.any_greedy:
            return probs
        one_hot = torch.zeros_like(probs).scatter_(1, greedy_ids, 1.0)
        return torch.where(info.is_greedy.unsqueeze(1), one_hot, probs)

    def _noise(self, info: SamplingBatchInfo) -> torch.Tensor:
        """``[bs, vocab]`` Exp(1) noise; rows with a seed get their own reproducible stream."""
        bs, vocab = info.batch_size, info.vocab_size
        noise = torch.empty(bs, vocab, device=self.device).exponential_(generator=self.generator)
        for i, seed in enumerate(info.seeds):
            if seed is not None:
                gen = torch.Generator(self.device).manual_seed(_step_seed(seed, info.steps[i]))
                noise[i].exponential_(generator=gen)
        # Exp(1) may round to 0; keep the race well defined (0-probability tokens never win)
        return noise.clamp_min_(torch.finfo(torch.float32).tiny)


def apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Repetition (prompt + output), then frequency and presence (output) penalties; returns a
    new tensor (or ``logits`` itself when no row has penalties)."""
    x = logits
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


def _top_p(x: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Keep each row's smallest most-likely set with renormalised mass >= top_p.

    When every top-p row also has a top_k, only the first ``max_top_k`` sorted entries can be
    kept, so a partial ``topk`` replaces the full sort.
    """
    width = info.max_top_k if info.top_p_rows_have_top_k and info.max_top_k > 0 else x.shape[-1]
    sorted_x = (
        x.topk(width, dim=-1).values
        if width < x.shape[-1]
        else x.sort(dim=-1, descending=True).values
    )
    sorted_p = torch.softmax(sorted_x, dim=-1)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    num_keep = (mass_before < info.top_ps.unsqueeze(1)).sum(dim=-1, keepdim=True).clamp(min=1)
    cutoff = sorted_x.gather(1, num_keep - 1)
    cutoff = cutoff.masked_fill(info.top_ps.unsqueeze(1) >= 1.0, _MASK)  # rows without top-p
    return x.masked_fill(x < cutoff, _MASK)


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit seed for draw ``step`` of the stream of ``seed`` (splitmix-style mixing)."""
    z = (seed * _GOLDEN + (step + 1) * _MIX) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * _MIX) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF
