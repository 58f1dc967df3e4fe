"""A pure-torch implementation of FlashInfer's paged-attention contract, for CPU tests.

Same inputs as FlashInfer's batch wrappers: a paged K/V cache in NHD layout
``[num_pages, page_size, num_kv_heads, head_dim]``, ``kv_indptr`` / ``kv_indices`` /
``kv_last_page_len`` in CSR form and, for prefill, ``qo_indptr``. Causal masking is aligned to
the end of each request's KV (query ``i`` of ``qo_len`` sits at ``kv_len - qo_len + i``), and
``window_left = w >= 0`` restricts query position ``p`` to keys in ``[p - w, p]``. With
``return_lse``, the log-sum-exp of each query row's scaled logits comes back too, in base 2 as
FlashInfer's kernels write it (``-inf`` for a request with no keys, whose output is zeros).

:class:`ReferencePrefillWrapper` / :class:`ReferenceDecodeWrapper` /
:class:`ReferenceRaggedWrapper` mimic the ``plan``/``run`` methods of
``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` / ``BatchDecodeWithPagedKVCacheWrapper`` /
``BatchPrefillWithRaggedKVCacheWrapper``, and :func:`merge_state_reference` is
``flashinfer.merge_state``, so :class:`FlashInferBackend` runs on CPU with them. Written for
clarity (a loop over requests, float32 math), not speed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

LOG2E = math.log2(math.e)


def paged_attention_reference(
    q: torch.Tensor,  # [total_q, num_qo_heads, head_dim]
    k_cache: torch.Tensor,  # [num_pages, page_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_pages, page_size, num_kv_heads, head_dim]
    qo_indptr: torch.Tensor,  # [bs + 1]
    kv_indptr: torch.Tensor,  # [bs + 1]: request b's pages are kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_indices: torch.Tensor,  # [num_used_pages]
    kv_last_page_len: torch.Tensor,  # [bs]: valid slots of each request's last page, 1..page_size
    causal: bool = True,
    sm_scale: float | None = None,
    window_left: int = -1,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``[total_q, num_qo_heads, head_dim]``, and with ``return_lse`` the base-2 log-sum-exp
    ``[total_q, num_qo_heads]`` (float32)."""
    page_size, num_kv_heads, head_dim = k_cache.shape[1:]
    group = q.shape[1] // num_kv_heads
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], float("-inf"), device=q.device)
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    for b in range(len(qo) - 1):
        pages = kv_indices[kvp[b] : kvp[b + 1]].long()
        if len(pages) == 0:
            continue  # no keys: zeros, and a log-sum-exp of -inf
        kv_len = (len(pages) - 1) * page_size + last[b]
        k = (
            k_cache[pages]
            .reshape(-1, num_kv_heads, head_dim)[:kv_len]
            .float()
            .repeat_interleave(group, dim=1)
        )
        v = (
            v_cache[pages]
            .reshape(-1, num_kv_heads, head_dim)[:kv_len]
            .float()
            .repeat_interleave(group, dim=1)
        )
        qb = q[qo[b] : qo[b + 1]].float()
        qo_len = qb.shape[0]
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale
        qpos = torch.arange(kv_len - qo_len, kv_len).unsqueeze(1)
        kpos = torch.arange(kv_len).unsqueeze(0)
        visible = kpos <= qpos if causal else torch.ones(qo_len, kv_len, dtype=torch.bool)
        if window_left >= 0:
            visible = visible & (kpos >= qpos - window_left)
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qo[b] : qo[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
        lse[qo[b] : qo[b + 1]] = torch.logsumexp(scores, dim=-1).T * LOG2E
    return (out, lse) if return_lse else out


def merge_state_reference(
    v_a: torch.Tensor,  # [n, heads, head_dim]: attention over the keys of segment A
    s_a: torch.Tensor,  # [n, heads] float32: its base-2 log-sum-exp
    v_b: torch.Tensor,
    s_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashinfer.merge_state``: the attention over A's and B's keys together, and its
    log-sum-exp. A side with no keys (``-inf``) contributes nothing."""
    s_max = torch.maximum(s_a, s_b)
    s_max = torch.where(torch.isinf(s_max), torch.zeros_like(s_max), s_max)  # both empty
    w_a, w_b = torch.exp2(s_a - s_max), torch.exp2(s_b - s_max)
    total = w_a + w_b
    merged = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / total.clamp_min(
        torch.finfo(torch.float32).tiny
    )[..., None]
    return merged.to(v_a.dtype), s_max + torch.log2(total)


class _PagedRun:
    """``run(q, (k, v), return_lse=...)`` over the page table and options ``plan`` kept."""

    def __init__(self) -> None:
        self._plan: dict[str, Any] = {}

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return paged_attention_reference(q, *paged_kv_cache, **self._plan, return_lse=return_lse)


class ReferencePrefillWrapper(_PagedRun):
    """``plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads,
    head_dim, page_size, causal=..., sm_scale=..., window_left=...)`` then ``run(q, (k, v))``."""

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        causal: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        **_: Any,
    ) -> None:
        self._plan = dict(
            qo_indptr=qo_indptr,
            kv_indptr=paged_kv_indptr,
            kv_indices=paged_kv_indices,
            kv_last_page_len=paged_kv_last_page_len,
            causal=causal,
            sm_scale=sm_scale,
            window_left=window_left,
        )


class ReferenceDecodeWrapper(_PagedRun):
    """``plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim,
    page_size, sm_scale=..., window_left=...)`` then ``run(q, (k, v))`` with one query per request."""

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        sm_scale: float | None = None,
        window_left: int = -1,
        **_: Any,
    ) -> None:
        bs = len(last_page_len)
        self._plan = dict(
            qo_indptr=torch.arange(bs + 1),
            kv_indptr=indptr,
            kv_indices=indices,
            kv_last_page_len=last_page_len,
            causal=False,
            sm_scale=sm_scale,
            window_left=window_left,
        )


class ReferenceGraphDecodeWrapper(_PagedRun):
    """FlashInfer's decode wrapper in CUDA-graph mode: its page table lives in fixed buffers the
    caller hands it, and ``run`` reads them there. ``plan`` copies the table into them (as
    FlashInfer's does); :meth:`ReferenceWrappers.fast_decode_plan` copies nothing (the caller
    wrote them)."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> None:
        super().__init__()
        self.buffers = (indptr, indices, last)

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        *heads: int,
        **kwargs: Any,
    ) -> None:
        for buf, src in zip(self.buffers, (indptr, indices, last_page_len), strict=True):
            buf[: len(src)].copy_(src)
        self.plan_only(**kwargs)

    def plan_only(self, sm_scale: float | None = None, window_left: int = -1, **_: Any) -> None:
        """The options alone; the page table is whatever the buffers hold when ``run`` reads."""
        indptr, indices, last = self.buffers
        self._plan = dict(
            qo_indptr=torch.arange(len(indptr)),
            kv_indptr=indptr,
            kv_indices=indices,
            kv_last_page_len=last,
            causal=False,
            sm_scale=sm_scale,
            window_left=window_left,
        )


class ReferenceGraphPrefillWrapper(ReferencePrefillWrapper):
    """FlashInfer's paged prefill wrapper in CUDA-graph mode: ``plan`` copies the query and
    page tables into the fixed buffers the caller handed it, and ``run`` reads them there. Its
    rules hold here too (``ValueError``): every plan has the batch size of the buffers, no more
    query rows than the first plan had, and a page table that fits."""

    def __init__(
        self, qo: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor
    ) -> None:
        super().__init__()
        self.buffers = (qo, indptr, indices, last)
        self._max_rows: int | None = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        qo_buf, indptr_buf, indices_buf, last_buf = self.buffers
        rows = int(qo_indptr[-1])
        if self._max_rows is None:
            self._max_rows = rows
        if len(qo_indptr) != len(qo_buf) or rows > self._max_rows:
            raise ValueError("a graph's prefill plan: another batch size, or more query rows")
        if len(paged_kv_indices) > len(indices_buf):
            raise ValueError("the page table exceeds the graph's buffer")
        qo_buf.copy_(qo_indptr)
        indptr_buf.copy_(paged_kv_indptr)
        last_buf.copy_(paged_kv_last_page_len)
        indices_buf[: len(paged_kv_indices)].copy_(paged_kv_indices)
        super().plan(qo_buf, indptr_buf, indices_buf, last_buf, *args, **kwargs)


class ReferenceRaggedWrapper:
    """``plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, causal=...,
    sm_scale=..., window_left=...)`` then ``run(q, k, v, return_lse=...)``: request ``b``'s keys
    are rows ``kv_indptr[b]:[b+1]`` of ``k`` / ``v`` themselves, not a page table, which is the
    paged contract with a page per row, each request's pages its own rows in order."""

    def __init__(self) -> None:
        self._paged = ReferencePrefillWrapper()

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        **kwargs: Any,
    ) -> None:
        rows = torch.arange(int(kv_indptr[-1]))
        ones = torch.ones(len(kv_indptr) - 1, dtype=torch.int32)
        heads = (num_qo_heads, num_kv_heads, head_dim_qk, 1)
        self._paged.plan(qo_indptr, kv_indptr, rows, ones, *heads, **kwargs)

    def run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self._paged.run(q, (k.unsqueeze(1), v.unsqueeze(1)), return_lse=return_lse)


class ReferenceWrappers:
    """A wrapper factory for :class:`FlashInferBackend` that needs no GPU."""

    def prefill(self) -> ReferencePrefillWrapper:
        return ReferencePrefillWrapper()

    def decode(self) -> ReferenceDecodeWrapper:
        return ReferenceDecodeWrapper()

    def ragged(self) -> ReferenceRaggedWrapper:
        return ReferenceRaggedWrapper()

    def graph_decode(self, buffers: Any, bs: int) -> ReferenceGraphDecodeWrapper:
        """A graph-mode decode wrapper over ``buffers`` (``GraphBuffers``) for ``bs`` rows."""
        return ReferenceGraphDecodeWrapper(
            buffers.kv_indptr[: bs + 1], buffers.kv_indices, buffers.kv_last_page_len[:bs]
        )

    def graph_prefill(self, buffers: Any, bs: int) -> ReferenceGraphPrefillWrapper:
        """A graph-mode paged prefill wrapper over ``buffers`` (``GraphBuffers``), ``bs``
        requests."""
        return ReferenceGraphPrefillWrapper(
            buffers.qo_indptr[: bs + 1],
            buffers.kv_indptr[: bs + 1],
            buffers.kv_indices,
            buffers.kv_last_page_len[:bs],
        )

    def fast_decode_plan(
        self,
        wrapper: ReferenceGraphDecodeWrapper,
        indptr: torch.Tensor,
        *args: Any,
        max_kv_len: int,
        **kwargs: Any,
    ) -> None:
        wrapper.plan_only(**kwargs)

    def merge_state(
        self, v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return merge_state_reference(v_a, s_a, v_b, s_b)
