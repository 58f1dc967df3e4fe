"""The attention backend interface shared by ``torch_native`` and ``flashinfer``.

Contract of every backend, per forward:

1. :meth:`AttentionBackend.init_forward_metadata` is called once with the :class:`ForwardBatch`
   before the first layer; whatever index/mask tensors the backend needs are built there, once,
   and kept on the backend object until the next call (not in a global).
2. Per layer, ``forward_extend`` / ``forward_decode`` receive the new tokens' ``q``, ``k``, ``v``.
   They write ``k``/``v`` into the :class:`KVCache` at ``batch.out_cache_loc``, then attend each
   request's queries over its whole sequence, read through
   ``req_to_token[req_pool_idx, :seq_len]`` (the cached prefix plus the tokens just written),
   causally aligned to the end of the sequence (query ``j`` of an extend sits at position
   ``prefix_len + j``), and with the layer's sliding window if it has one.
3. Nothing else in the pools is written. The scheduler filled ``req_to_token`` beforehand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from radixserve.models.forward_batch import ForwardBatch


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """The attention shape of a model, as a backend needs it."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float  # softmax scale, head_dim ** -0.5 for the supported families
    # per layer: None (full attention) or W, attending keys at positions (p - W, p] of query p
    sliding_windows: tuple[int | None, ...]

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


class AttentionBackend(Protocol):
    """One object per model runner; see the module docstring for the contract."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare the per-batch metadata used by every layer of this forward."""
        ...

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """``q`` ``[num_tokens, num_heads, head_dim]``, ``k``/``v`` ``[num_tokens, num_kv_heads,
        head_dim]`` -> attention output ``[num_tokens, num_heads * head_dim]``."""
        ...

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """As :meth:`forward_extend` with one token per request (``num_tokens == bs``)."""
        ...

    def fused_args(self, layer_id: int, batch: ForwardBatch) -> tuple[object, ...] | None:
        """What ``CpuKernels.decoder_layer`` needs of this backend for ``layer_id`` (the KV
        buffers, the slots, rows and lengths of ``batch``, the scale and window), or ``None``
        where the attention is not the CPU kernel's (the layer then runs op by op)."""
        ...
