"""TorchNativeBackend: paged attention with plain torch ops; the CPU path and the reference.

Both modes gather every request's K/V through its ``req_to_token`` row into a padded
``[bs, num_kv_heads, max_seq_len, head_dim]`` view and attend the whole batch at once, masking
padding, the causal future and (per layer) the sliding window; K/V are never repeated per
query head (each KV head's query group is folded into the query rows).

- DECODE: ONE ``scaled_dot_product_attention`` call with queries ``[bs, kv_heads, group_size,
  head_dim]`` (measured several times faster than ``enable_gqa`` with one query row: 1.4 vs
  15 ms for bf16, bs 32, 512 keys);
- EXTEND: blocks of ``EXTEND_BLOCK`` query rows, each two batched matmuls and a float32
  softmax over only the keys the block can see (numerics of transformers' eager attention);
  over a long cached prefix (``SDPA_MIN_PREFIX``), one SDPA call with the groups folded in.

All index and mask tensors are built once per batch in :meth:`init_forward_metadata`; no
per-request Python loop runs per layer.

This is the pure-torch reference (float32 exactly); the ``cpu_kernel`` backend runs the C++
kernel of :mod:`radixserve.models.kernels` instead where it can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionSpec

if TYPE_CHECKING:
    from radixserve.models.forward_batch import ForwardBatch

# Query rows per block of EXTEND attention. Blocks skip the keys after their last query (half
# the work of a causal prefill) and keep the scores small; on this CPU a 512-token bf16 prefill
# layer (14 heads, 2 KV heads) takes 3.6 ms with 64-row blocks, 6.3 ms with 128 and 6.9 ms in
# SDPA's flash kernel.
EXTEND_BLOCK = 64
# an extend whose cached prefix is at least this long (and at least its own length) runs as one
# SDPA call: 22 vs 30 ms per layer for 400 queries over 1,900 keys in bf16, while with no
# prefix the blocked path wins (3.6 vs 6.9 ms per layer for a 512-token prompt)
SDPA_MIN_PREFIX = 256


@dataclass(slots=True)
class _Metadata:
    bs: int
    max_seq: int
    max_ext: int  # 1 in DECODE mode
    # [bs * max_seq] int64: the KV slot of token j of request b sits at b * max_seq + j
    kv_index: torch.Tensor
    # [num_tokens] int64: each token's row in the padded [bs * max_ext] queries; None: no padding
    q_dest: torch.Tensor | None
    # DECODE: window -> SDPA mask (True: attend) [bs, 1, 1, max_seq], or None: nothing to mask
    # EXTEND: window -> hidden keys (True: masked out) [bs, 1, 1, max_ext, max_seq]
    masks: dict[int | None, torch.Tensor | None]
    # EXTEND: per block of EXTEND_BLOCK queries, how many keys (from 0) any of its rows can see
    key_ends: list[int]
    # EXTEND over a long prefix: window -> SDPA mask (True: attend) [bs, 1, group * max_ext,
    # max_seq] for one call with the query groups folded into rows; None: the blocked path
    sdpa_masks: dict[int | None, torch.Tensor] | None = None


class TorchNativeBackend:
    """See the module docstring; an :class:`~radixserve.models.attention.base.AttentionBackend`."""

    def __init__(
        self,
        spec: AttentionSpec,
        kv_cache: KVCache,
        req_to_token_pool: ReqToTokenPool,
    ) -> None:
        self.spec = spec
        self.kv_cache = kv_cache
        self.req_to_token = req_to_token_pool.req_to_token  # [rows, max_context_len] int32
        self._md: _Metadata | None = None

    # ---- metadata ------------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        seq = batch.seq_lens_list
        bs, max_seq = len(seq), max(seq)
        device = self.req_to_token.device
        # [bs, max_seq]
        rows = self.req_to_token[:, :max_seq].index_select(0, batch.req_pool_indices)
        kv_index = rows.reshape(-1).to(torch.int64)  # stale entries past seq_len are masked
        arange_s = torch.arange(max_seq, device=device)
        windows = set(self.spec.sliding_windows)
        if batch.is_decode:
            qpos = batch.seq_lens.view(bs, 1, 1, 1) - 1  # [bs, 1, 1, 1]: the new token's position
            uniform = min(seq) == max_seq
            masks: dict[int | None, torch.Tensor | None] = {}
            for w in windows:
                needed = not uniform or (w is not None and w < max_seq)
                masks[w] = _mask(qpos, arange_s, w) if needed else None  # [bs, 1, 1, max_seq]
            self._md = _Metadata(bs, max_seq, 1, kv_index, None, masks, [])
            return
        ext = batch.extend_seq_lens_list
        max_ext = max(ext)
        num_tokens = batch.num_tokens
        q_dest = None
        if min(ext) != max_ext:  # pad each request's queries to max_ext rows
            lens = batch.extend_seq_lens
            row_base = torch.repeat_interleave(
                torch.arange(bs, device=device) * max_ext, lens, output_size=num_tokens
            )
            prefix = torch.repeat_interleave(batch.extend_prefix_lens, lens, output_size=num_tokens)
            q_dest = row_base + batch.positions - prefix
        arange_e = torch.arange(max_ext, device=device)
        # query i of request b sits at prefix_b + i; padded queries (i >= ext_b) see key 0 only
        qpos = batch.extend_prefix_lens.view(bs, 1) + arange_e.view(1, max_ext)  # [bs, max_ext]
        qpos = torch.where(arange_e.view(1, max_ext) < batch.extend_seq_lens.view(bs, 1), qpos, 0)
        hidden = {w: ~_mask(qpos.view(bs, 1, 1, max_ext, 1), arange_s, w) for w in windows}
        max_prefix = max(batch.extend_prefix_lens_list)
        blocks = range(0, max_ext, EXTEND_BLOCK)
        key_ends = [min(max_seq, max_prefix + min(s + EXTEND_BLOCK, max_ext)) for s in blocks]
        sdpa_masks = None
        if max_prefix >= max(SDPA_MIN_PREFIX, max_ext):
            g = self.spec.group_size
            sdpa_masks = {
                w: (~h).expand(bs, 1, g, max_ext, max_seq).reshape(bs, 1, g * max_ext, max_seq)
                for w, h in hidden.items()
            }
        self._md = _Metadata(
            bs, max_seq, max_ext, kv_index, q_dest, dict(hidden), key_ends, sdpa_masks
        )

    # ---- per layer -----------------------------------------------------------------------
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        md = self._metadata()
        k_all, v_all = self._write_and_gather(k, v, layer_id, batch, md)
        spec = self.spec
        bs, e, kvh, g, d = md.bs, md.max_ext, spec.num_kv_heads, spec.group_size, spec.head_dim
        if md.q_dest is None:
            qp = q.reshape(bs, e, kvh, g, d)
        else:
            qp = (
                q.new_zeros(bs * e, spec.num_heads, d)
                .index_copy_(0, md.q_dest, q)
                .view(bs, e, kvh, g, d)
            )
        q5 = qp.permute(0, 2, 3, 1, 4)  # [bs, kv_heads, group, max_ext, head_dim]
        if md.sdpa_masks is not None:
            mask = md.sdpa_masks[spec.sliding_windows[layer_id]]
            qf = q5.reshape(bs, kvh, g * e, d)
            of = F.scaled_dot_product_attention(
                qf, k_all, v_all, attn_mask=mask, scale=spec.scaling
            )
            o = of.view(bs, kvh, g, e, d).permute(0, 3, 1, 2, 4).reshape(bs * e, spec.num_heads * d)
            return o if md.q_dest is None else o.index_select(0, md.q_dest)
        hidden = md.masks[spec.sliding_windows[layer_id]]
        assert hidden is not None
        out = q.new_empty(bs, e, kvh, g, d)
        for start, kend in zip(range(0, e, EXTEND_BLOCK), md.key_ends, strict=True):
            stop = min(start + EXTEND_BLOCK, e)
            n = stop - start
            qb = q5[:, :, :, start:stop].reshape(bs, kvh, g * n, d)
            scores = torch.matmul(
                qb, k_all[:, :, :kend].transpose(-1, -2)
            )  # [bs, kvh, g * n, kend]
            scores = scores.view(bs, kvh, g, n, kend).mul_(spec.scaling)
            scores.masked_fill_(hidden[..., start:stop, :kend], float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            ob = torch.matmul(
                probs.view(bs, kvh, g * n, kend), v_all[:, :, :kend]
            )  # [bs, kvh, g * n, d]
            out[:, start:stop] = ob.view(bs, kvh, g, n, d).permute(0, 3, 1, 2, 4)
        o = out.view(bs * e, spec.num_heads * d)
        return o if md.q_dest is None else o.index_select(0, md.q_dest)

    def fused_args(self, layer_id: int, batch: ForwardBatch) -> None:
        return None  # the layer runs op by op

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        md = self._metadata()
        k_all, v_all = self._write_and_gather(k, v, layer_id, batch, md)
        spec = self.spec
        # [bs, kv_heads, group, head_dim]: query head h belongs to KV head h // group_size
        qf = q.reshape(md.bs, spec.num_kv_heads, spec.group_size, spec.head_dim)
        mask = md.masks[spec.sliding_windows[layer_id]]
        o = F.scaled_dot_product_attention(qf, k_all, v_all, attn_mask=mask, scale=spec.scaling)
        return o.reshape(md.bs, spec.num_heads * spec.head_dim)

    # ---- internals -----------------------------------------------------------------------
    def _metadata(self) -> _Metadata:
        assert self._md is not None, "init_forward_metadata was not called for this batch"
        return self._md

    def _write_and_gather(
        self, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch, md: _Metadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new K/V, then gather each request's sequence: two ``[bs, kv_heads, max_seq,
        head_dim]`` (strided views; SDPA reads them without a copy)."""
        self.kv_cache.set_kv(layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_cache.get_kv(layer_id)
        shape = (md.bs, md.max_seq, self.spec.num_kv_heads, self.spec.head_dim)
        k_all = k_buf.index_select(0, md.kv_index).view(shape).transpose(1, 2)
        v_all = v_buf.index_select(0, md.kv_index).view(shape).transpose(1, 2)
        return k_all, v_all


def _mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """True where key position ``kpos`` is visible from query position ``qpos`` (broadcast):
    causal, and inside ``(qpos - window, qpos]`` when a window is set."""
    visible = kpos <= qpos
    if window is not None:
        visible = visible & (kpos > qpos - window)
    return visible
