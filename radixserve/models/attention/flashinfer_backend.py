"""FlashInferBackend: paged attention on CUDA through FlashInfer's batch wrappers.

The KV pool is presented to FlashInfer as pages of ONE slot (NHD layout: ``k_buffer[layer]``
``[num_slots, kv_heads, head_dim]`` viewed as ``[num_slots, 1, kv_heads, head_dim]``), so each
request's page table is simply its ``req_to_token`` row: ``kv_indices`` concatenates
``req_to_token[row_i, :seq_len_i]``, ``kv_indptr`` is the running sum of ``seq_len``,
``kv_last_page_len`` is all ones and ``qo_indptr`` the running sum of ``extend_len``.
:func:`build_paged_kv_metadata` builds these with torch ops only (tested on CPU).

An extend may split as SGLang's FlashInfer backend does (``ragged_prefill``): on each
full-attention layer, the new tokens attend to one another through the ragged kernel, which
reads their ``k`` / ``v`` as they are, with no page table; where the batch has a cached prefix,
its queries also attend to the prefix alone through the paged kernel (not causal: all of a
prefix precedes every new token), and ``merge_state`` joins the two by their log-sum-exps.
``"cold"`` (the default) takes the ragged kernel for a batch with nothing cached and one paged
pass for any other: on an H200 the ragged kernel alone was 1.03-1.05x the paged pass over a
cold 4096-token prompt, and the split 0.75-0.85x it on 256 new tokens after 4096 cached
(``benchmarks/gpu/prefill_split.py``). ``"split"`` splits every extend, ``"off"`` none.
Layers with a sliding window keep the single causal paged pass over the whole sequence.

``flashinfer`` is imported lazily, in :class:`FlashInferWrappers` only. Tests inject
:class:`~radixserve.models.attention.paged_reference.ReferenceWrappers` to run this backend
on CPU against the same contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionSpec
from radixserve.models.attention.flashinfer_wrappers import (
    FlashInferWrappers,
    GraphBuffers,
    WrapperFactory,
)

if TYPE_CHECKING:
    from radixserve.models.forward_batch import ForwardBatch

RAGGED_MODES = ("cold", "split", "off")  # see the module doc


@dataclass(frozen=True, slots=True)
class PagedKVMetadata:
    """FlashInfer's CSR page table over ``req_to_token`` with page size 1 (int32 tensors). The
    indptrs and last page lengths are on the host: FlashInfer's ``plan`` reads them there, and
    a device copy would cost a device-to-host sync every step (waiting for the forward in
    flight); the indices are gathered on the device."""

    qo_indptr: torch.Tensor  # [bs + 1], host: request b's queries are rows qo_indptr[b]:[b+1]
    kv_indptr: torch.Tensor  # [bs + 1], host
    kv_indices: torch.Tensor  # [sum(seq_lens)], device: KV slots, request after request
    kv_last_page_len: torch.Tensor  # [bs], host: all ones


def host_indptr(lens: Sequence[int]) -> torch.Tensor:
    """``[len(lens) + 1]`` int32 on the host: 0, then the running sum of ``lens``."""
    out = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=out[1:])
    return torch.from_numpy(out)


def gather_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    total_kv: int,
) -> torch.Tensor:
    """``req_to_token[row_i, :seq_len_i]`` request after request, on the device (``total_kv``:
    the lengths' sum, from the host, so nothing waits for the device)."""
    starts = torch.cumsum(seq_lens, 0) - seq_lens  # [bs] on the device: each request's offset
    rows = torch.repeat_interleave(req_pool_indices, seq_lens, output_size=total_kv)
    cols = torch.arange(total_kv, device=req_to_token.device) - torch.repeat_interleave(
        starts, seq_lens, output_size=total_kv
    )
    return req_to_token[rows, cols]


def build_paged_kv_metadata(
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [bs] int64, on req_to_token's device
    seq_lens: torch.Tensor,  # [bs] int64, the same: KV length after the step
    seq_lens_list: list[int],  # the same numbers on the host
    extend_seq_lens_list: list[int] | None,  # None: decode, one query per request
) -> PagedKVMetadata:
    """A pure function of its inputs; vectorised (no loop over requests), no device sync."""
    bs = len(seq_lens_list)
    kv_indptr = host_indptr(seq_lens_list)
    kv_indices = gather_kv_indices(req_to_token, req_pool_indices, seq_lens, int(kv_indptr[-1]))
    if extend_seq_lens_list is None:
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32)
    else:
        qo_indptr = host_indptr(extend_seq_lens_list)
    return PagedKVMetadata(
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_last_page_len=torch.ones(bs, dtype=torch.int32),
    )


class FlashInferBackend:
    """Implements :class:`~radixserve.models.attention.base.AttentionBackend` with FlashInfer.

    One prefill and one decode wrapper per distinct sliding window (FlashInfer fixes
    ``window_left`` when planning), planned once per batch in :meth:`init_forward_metadata`;
    also one ragged wrapper for the full-attention layers' extends (``ragged_prefill``: when
    they split, their paged prefill wrapper covers the cached prefix only). With
    :meth:`init_cuda_graphs`, also one decode wrapper per window and captured batch size,
    planned by :meth:`init_graph_metadata` before each replay (with ``fast_graph_plan``, after
    the first, through FlashInfer's ``fast_decode_plan``); with :meth:`init_verify_graphs`,
    one paged prefill wrapper per window and verify graph size, planned by
    :meth:`init_verify_graph_metadata`. ``decode_tensor_cores``: see
    :func:`decode_on_tensor_cores`.
    """

    def __init__(
        self,
        spec: AttentionSpec,
        kv_cache: KVCache,
        req_to_token_pool: ReqToTokenPool,
        wrappers: WrapperFactory | None = None,
        ragged_prefill: str = "cold",
        fast_graph_plan: bool = True,
        decode_tensor_cores: bool | None = None,
    ) -> None:
        self.spec = spec
        self.kv_cache = kv_cache
        self.req_to_token = req_to_token_pool.req_to_token
        factory = wrappers
        if factory is None:
            factory = FlashInferWrappers(spec, kv_cache.device, decode_tensor_cores)
        self._factory = factory
        windows = set(spec.sliding_windows)
        self._prefill = {w: factory.prefill() for w in windows}
        self._decode = {w: factory.decode() for w in windows}
        self._ragged = factory.ragged() if None in windows else None
        self.ragged_prefill = ragged_prefill  # checked by the property
        self._graph_decode: dict[int, dict[int | None, Any]] = {}  # batch size -> per window
        self._graph_buffers: GraphBuffers | None = None
        self._graph_verify: dict[int, dict[int | None, Any]] = {}  # batch size -> per window
        self._graph_planned: set[int] = set()  # sizes planned in full once (at capture)
        # after that, a replay's plan writes the graph buffers itself and calls the fast plan
        self.fast_graph_plan = fast_graph_plan
        self._active = self._decode  # the wrappers the last plan was for
        self._split = False  # the last plan: full-attention extends run ragged (+ prefix)
        self._has_prefix = False  # ... and some request of it has a cached prefix

    @property
    def ragged_prefill(self) -> str:
        """Which extends split (see the module doc): ``"cold"``, ``"split"`` or ``"off"``."""
        return self._ragged_prefill

    @ragged_prefill.setter
    def ragged_prefill(self, mode: str) -> None:
        if mode not in RAGGED_MODES:
            raise ValueError(f"ragged_prefill must be one of {RAGGED_MODES}, not {mode!r}")
        self._ragged_prefill = mode

    def init_cuda_graphs(self, batch_sizes: list[int], max_context_len: int) -> None:
        """Decode wrappers for CUDA graphs of each of ``batch_sizes``, their page tables in one
        set of :class:`GraphBuffers` (every window reads the same table)."""
        buffers = GraphBuffers.allocate(max(batch_sizes), max_context_len, self.kv_cache.device)
        self._graph_buffers = buffers
        self._graph_decode = {
            bs: {w: self._factory.graph_decode(buffers, bs) for w in self._decode}
            for bs in batch_sizes
        }

    def init_verify_graphs(
        self, batch_sizes: list[int], max_tokens: int, max_context_len: int
    ) -> None:
        """Paged prefill wrappers for the verify graphs (``runtime/verify_graph.py``): per size
        ``bs`` of ``batch_sizes`` and window, one over ``bs + 1`` requests (the last one holds
        the padding tokens), of up to ``max_tokens`` query rows; their tables in one set of
        :class:`GraphBuffers`."""
        rows = max(batch_sizes) + 1
        device = self.kv_cache.device
        buffers = GraphBuffers.allocate(rows, max_context_len, device, extra_indices=max_tokens)
        self._graph_verify = {
            bs: {w: self._factory.graph_prefill(buffers, bs + 1) for w in self._prefill}
            for bs in batch_sizes
        }

    def init_verify_graph_metadata(self, batch: ForwardBatch, num_real: int) -> None:
        """Plan the verify graph wrappers for ``batch``, a verify graph's padded batch: its
        first ``num_real`` requests are real, read through ``req_to_token``; the others are
        padding whose keys are all the padding slot 0. One causal paged pass, as an eager
        verify takes (a verify never splits: its new tokens are a few)."""
        n, lens = num_real, batch.seq_lens_list
        real = gather_kv_indices(
            self.req_to_token, batch.req_pool_indices[:n], batch.seq_lens[:n], sum(lens[:n])
        )
        pad = torch.zeros(sum(lens[n:]), dtype=torch.int32, device=self.kv_cache.device)
        kv_indices = torch.cat([real, pad])
        qo_indptr = host_indptr(batch.extend_seq_lens_list)
        kv_indptr = host_indptr(batch.seq_lens_list)
        last_page_len = torch.ones(batch.batch_size, dtype=torch.int32)
        spec = self.spec
        heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim, 1)  # page size 1
        wrappers = self._graph_verify[batch.batch_size - 1]
        for w, wrapper in wrappers.items():
            wrapper.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                last_page_len,
                *heads,
                causal=True,
                **self._common(w),
            )
        self._active, self._split = wrappers, False

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.is_decode:
            self._plan(batch, self._decode)
        else:
            self._plan_extend(batch)

    def init_graph_metadata(self, batch: ForwardBatch) -> None:
        """Plan the graph wrappers of ``batch``'s (captured) size: a decode batch whose tensors
        are the graph's own inputs. The first plan of a size is FlashInfer's full ``plan``
        (it resolves the kernel module); later ones, with ``fast_graph_plan``, write the page
        table into the graph buffers here and call the fast plan."""
        bs = batch.batch_size
        wrappers = self._graph_decode[bs]
        if not self.fast_graph_plan or bs not in self._graph_planned:
            self._plan(batch, wrappers)
            self._graph_planned.add(bs)
            return
        buffers = self._graph_buffers
        assert buffers is not None
        md = build_paged_kv_metadata(
            self.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.seq_lens_list, None
        )
        indices = buffers.kv_indices[: md.kv_indices.shape[0]]
        indices.copy_(md.kv_indices, non_blocking=True)
        indptr = buffers.kv_indptr[: bs + 1]
        indptr.copy_(
            md.kv_indptr.pin_memory() if indptr.is_cuda else md.kv_indptr, non_blocking=True
        )
        spec = self.spec
        heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim, 1)  # page size 1
        max_kv_len = max(batch.seq_lens_list)
        for w, wrapper in wrappers.items():
            self._factory.fast_decode_plan(
                wrapper,
                md.kv_indptr,
                indices,
                md.kv_last_page_len,
                *heads,
                max_kv_len=max_kv_len,
                **self._common(w),
            )
        self._active = wrappers

    def _common(self, window: int | None) -> dict[str, Any]:
        """The keywords every ``plan`` of a layer with ``window`` takes."""
        dtype = self.kv_cache.dtype
        window_left = -1 if window is None else window - 1  # keys (p - w, p] == [p - (w - 1), p]
        return dict(
            sm_scale=self.spec.scaling,
            window_left=window_left,
            q_data_type=dtype,
            kv_data_type=dtype,
        )

    def _plan(
        self,
        batch: ForwardBatch,
        wrappers: dict[int | None, Any],
        kv_lens: tuple[torch.Tensor, list[int]] | None = None,
        causal: bool = True,
    ) -> None:
        """Plan ``wrappers`` over each request's first ``kv_lens`` KV slots (default: all of
        them, ``seq_lens``): decode wrappers for a decode batch, paged prefill ones else."""
        lens, lens_list = kv_lens if kv_lens is not None else (batch.seq_lens, batch.seq_lens_list)
        md = build_paged_kv_metadata(
            self.req_to_token,
            batch.req_pool_indices,
            lens,
            lens_list,
            None if batch.is_decode else batch.extend_seq_lens_list,
        )
        self._active = wrappers
        spec = self.spec
        heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim, 1)  # page size 1
        for w, wrapper in wrappers.items():
            if batch.is_decode:
                wrapper.plan(
                    md.kv_indptr, md.kv_indices, md.kv_last_page_len, *heads, **self._common(w)
                )
            else:
                wrapper.plan(
                    md.qo_indptr,
                    md.kv_indptr,
                    md.kv_indices,
                    md.kv_last_page_len,
                    *heads,
                    causal=causal,
                    **self._common(w),
                )

    def _plan_extend(self, batch: ForwardBatch) -> None:
        self._has_prefix = any(batch.extend_prefix_lens_list)
        mode = self.ragged_prefill
        cold = mode == "cold" and not self._has_prefix
        self._split = self._ragged is not None and (mode == "split" or cold)
        if not self._split:
            self._plan(batch, self._prefill)
            return
        windowed: dict[int | None, Any] = {w: p for w, p in self._prefill.items() if w is not None}
        if windowed:
            self._plan(batch, windowed)
        spec = self.spec
        qo = host_indptr(batch.extend_seq_lens_list)  # the new tokens: queries and keys alike
        heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim)
        assert self._ragged is not None
        self._ragged.plan(qo, qo, *heads, causal=True, **self._common(None))
        if self._has_prefix:  # the queries over the cached prefix alone: all of it is visible
            prefix = (batch.extend_prefix_lens, batch.extend_prefix_lens_list)
            self._plan(batch, {None: self._prefill[None]}, prefix, causal=False)
        self._active = self._prefill

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        if not self._split or self.spec.sliding_windows[layer_id] is not None:
            return self._run(q, k, v, layer_id, batch)
        assert self._ragged is not None
        self.kv_cache.set_kv(layer_id, batch.out_cache_loc, k, v)
        q = q.contiguous()
        if not self._has_prefix:
            o = self._ragged.run(q, k.contiguous(), v.contiguous())
        else:
            o_new, lse_new = self._ragged.run(q, k.contiguous(), v.contiguous(), return_lse=True)
            o_prefix, lse_prefix = self._prefill[None].run(
                q, self._paged(layer_id), return_lse=True
            )
            o, _ = self._factory.merge_state(o_new, lse_new, o_prefix, lse_prefix)
        return o.reshape(q.shape[0], self.spec.num_heads * self.spec.head_dim)

    def fused_args(self, layer_id: int, batch: ForwardBatch) -> None:
        return None  # the layer runs op by op

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        return self._run(q, k, v, layer_id, batch)

    def _paged(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool's K/V of ``layer_id`` as pages of one slot: ``[num_slots, 1, kv_heads,
        head_dim]`` each."""
        k_buf, v_buf = self.kv_cache.get_kv(layer_id)
        return k_buf.unsqueeze(1), v_buf.unsqueeze(1)

    def _run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_cache.set_kv(layer_id, batch.out_cache_loc, k, v)
        wrapper = self._active[self.spec.sliding_windows[layer_id]]
        o = wrapper.run(q.contiguous(), self._paged(layer_id))  # [num_tokens, heads, head_dim]
        return o.reshape(q.shape[0], self.spec.num_heads * self.spec.head_dim)
