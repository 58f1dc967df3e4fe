"""FlashInferBackend: paged attention on CUDA through FlashInfer's batch wrappers.

The KV pool is presented to FlashInfer as pages of ONE slot (NHD layout: ``k_buffer[layer]``
``[num_slots, kv_heads, head_dim]`` viewed as ``[num_slots, 1, kv_heads, head_dim]``), so each
request's page table is simply its ``req_to_token`` row: ``kv_indices`` concatenates
``req_to_token[row_i, :seq_len_i]``, ``kv_indptr`` is the running sum of ``seq_len``,
``kv_last_page_len`` is all ones and ``qo_indptr`` the running sum of ``extend_len``.
:func:`build_paged_kv_metadata` builds these with torch ops only (tested on CPU).

``flashinfer`` is imported lazily, in :class:`FlashInferWrappers` only. Tests inject
:class:`~radixserve.models.attention.paged_reference.ReferenceWrappers` to run this backend
on CPU against the same contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionSpec

if TYPE_CHECKING:
    from radixserve.models.forward_batch import ForwardBatch

WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PagedKVMetadata:
    """FlashInfer's CSR page table over ``req_to_token`` with page size 1 (int32 tensors)."""

    qo_indptr: torch.Tensor  # [bs + 1]: request b's queries are rows qo_indptr[b]:qo_indptr[b+1]
    kv_indptr: torch.Tensor  # [bs + 1]
    kv_indices: torch.Tensor  # [sum(seq_lens)]: KV slots, request after request
    kv_last_page_len: torch.Tensor  # [bs]: all ones


def build_paged_kv_metadata(
    req_to_token: torch.Tensor,  # [rows, max_context_len] int32
    req_pool_indices: torch.Tensor,  # [bs] int64
    seq_lens: torch.Tensor,  # [bs] int64: KV length after the step
    extend_seq_lens: torch.Tensor | None,  # [bs] int64 (None: decode, one query per request)
    total_kv: int,  # sum(seq_lens), known on the host (avoids a sync for the output size)
) -> PagedKVMetadata:
    """A pure function of its inputs; vectorised (no loop over requests)."""
    device = req_to_token.device
    bs = seq_lens.shape[0]
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    kv_indptr = torch.cat([zero, torch.cumsum(seq_lens, 0)])
    rows = torch.repeat_interleave(req_pool_indices, seq_lens, output_size=total_kv)
    starts = torch.repeat_interleave(kv_indptr[:-1], seq_lens, output_size=total_kv)
    cols = torch.arange(total_kv, device=device) - starts
    kv_indices = req_to_token[rows, cols]
    if extend_seq_lens is None:
        qo_indptr = torch.arange(bs + 1, device=device)
    else:
        qo_indptr = torch.cat([zero, torch.cumsum(extend_seq_lens, 0)])
    return PagedKVMetadata(
        qo_indptr=qo_indptr.to(torch.int32),
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=kv_indices.to(torch.int32),
        kv_last_page_len=torch.ones(bs, dtype=torch.int32, device=device),
    )


class WrapperFactory(Protocol):
    def prefill(self) -> Any: ...

    def decode(self) -> Any: ...


class FlashInferWrappers:
    """Real FlashInfer wrappers sharing one workspace buffer."""

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        import flashinfer  # optional extra [gpu]

        self._flashinfer = flashinfer
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        # the CUDA-core decode kernels cover group sizes 1/2/4/8; tensor cores handle any
        self.use_tensor_cores = spec.group_size not in (1, 2, 4, 8)

    def prefill(self) -> Any:
        # FlashAttention-2's templates, as SGLang's FlashInfer backend asks for: "auto" would
        # pick the Hopper (fa3) kernels, whose just-in-time build costs minutes more per shape
        return self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )

    def decode(self) -> Any:
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores
        )


class FlashInferBackend:
    """Implements :class:`~radixserve.models.attention.base.AttentionBackend` with FlashInfer.

    One prefill and one decode wrapper per distinct sliding window (FlashInfer fixes
    ``window_left`` when planning), planned once per batch in :meth:`init_forward_metadata`.
    """

    def __init__(
        self,
        spec: AttentionSpec,
        kv_cache: KVCache,
        req_to_token_pool: ReqToTokenPool,
        wrappers: WrapperFactory | None = None,
    ) -> None:
        self.spec = spec
        self.kv_cache = kv_cache
        self.req_to_token = req_to_token_pool.req_to_token
        factory = wrappers if wrappers is not None else FlashInferWrappers(spec, kv_cache.device)
        windows = set(spec.sliding_windows)
        self._prefill = {w: factory.prefill() for w in windows}
        self._decode = {w: factory.decode() for w in windows}
        self.metadata: PagedKVMetadata | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        spec = self.spec
        md = build_paged_kv_metadata(
            self.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            None if batch.is_decode else batch.extend_seq_lens,
            sum(batch.seq_lens_list),
        )
        self.metadata = md
        heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim, 1)  # page size 1
        dtypes = dict(q_data_type=self.kv_cache.dtype, kv_data_type=self.kv_cache.dtype)
        for w in self._prefill:
            window_left = -1 if w is None else w - 1  # keys (p - w, p] == [p - (w - 1), p]
            common = dict(sm_scale=spec.scaling, window_left=window_left, **dtypes)
            if batch.is_decode:
                self._decode[w].plan(
                    md.kv_indptr, md.kv_indices, md.kv_last_page_len, *heads, **common
                )
            else:
                self._prefill[w].plan(
                    md.qo_indptr,
                    md.kv_indptr,
                    md.kv_indices,
                    md.kv_last_page_len,
                    *heads,
                    causal=True,
                    **common,
                )

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        return self._run(self._prefill, q, k, v, layer_id, batch)

    def fused_args(self, layer_id: int, batch: ForwardBatch) -> None:
        return None  # the layer runs op by op

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        return self._run(self._decode, q, k, v, layer_id, batch)

    def _run(
        self,
        wrappers: dict[int | None, Any],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        self.kv_cache.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_cache.get_kv(layer_id)
        # pages of one slot: [num_slots, 1, kv_heads, head_dim] each
        paged = (k_buf.unsqueeze(1), v_buf.unsqueeze(1))
        wrapper = wrappers[self.spec.sliding_windows[layer_id]]
        o = wrapper.run(q.contiguous(), paged)  # [num_tokens, heads, head_dim]
        return o.reshape(q.shape[0], self.spec.num_heads * self.spec.head_dim)
