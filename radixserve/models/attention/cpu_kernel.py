"""CpuKernelBackend: paged attention through the C++ kernel of ``models/kernels`` on CPU.

Each layer is one kernel call over the whole EXTEND (or DECODE) batch: it reads K/V through
``req_to_token`` itself, so no padded gather, mask or per-batch index tensor is built (the
metadata is the batch itself). The kernel is flash-attention style with fp32 math over fp32 or
bf16 KV (widened in registers, so CPUs without bf16 arithmetic run bf16 KV at fp32 speed);
``torch_native`` stays the pure-torch reference it is tested against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.base import AttentionSpec
from radixserve.models.kernels import CpuKernels

if TYPE_CHECKING:
    from radixserve.models.forward_batch import ForwardBatch


class CpuKernelBackend:
    """See the module docstring; an :class:`~radixserve.models.attention.base.AttentionBackend`.

    ``ValueError`` when ``kernels`` has no attention kernel for this KV (device, dtype,
    head_dim): :func:`usable` says beforehand."""

    def __init__(
        self,
        spec: AttentionSpec,
        kv_cache: KVCache,
        req_to_token_pool: ReqToTokenPool,
        kernels: CpuKernels,
    ) -> None:
        kernel = kernels.attention_kernel(kv_cache.dtype, spec.head_dim)
        if kernel is None or kv_cache.device.type != "cpu":
            raise ValueError(
                f"no CPU attention kernel for {kv_cache.dtype} KV with head_dim "
                f"{spec.head_dim} on {kv_cache.device} (variant {kernels.variant})"
            )
        self.spec = spec
        self.kv_cache = kv_cache
        self.req_to_token = req_to_token_pool.req_to_token  # [rows, max_context_len] int32
        self.kernel = kernel
        self.kernels = kernels
        self._batch: ForwardBatch | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._batch = batch

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        assert batch is self._batch, "init_forward_metadata first"
        self.kernels.store_kv(self.kv_cache, layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_cache.get_kv(layer_id)
        spec = self.spec
        return self.kernel(
            q.reshape(q.shape[0], spec.num_heads * spec.head_dim),
            k_buf,
            v_buf,
            self.req_to_token,
            batch.req_pool_indices,
            batch.extend_prefix_lens,
            batch.extend_seq_lens,
            spec.num_heads,
            spec.scaling,
            spec.sliding_windows[layer_id] or 0,
        )

    forward_decode = forward_extend  # a decode batch is an extend of one token per request

    def fused_args(self, layer_id: int, batch: ForwardBatch) -> tuple[object, ...] | None:
        """The attention operands of ``try_decoder_layer`` (layer.cpp), in its order."""
        assert batch is self._batch, "init_forward_metadata first"
        k_buf, v_buf = self.kv_cache.get_kv(layer_id)
        spec = self.spec
        return (
            k_buf,
            v_buf,
            batch.out_cache_loc,
            self.req_to_token,
            batch.req_pool_indices,
            batch.extend_prefix_lens,
            batch.extend_seq_lens,
            spec.scaling,
            spec.sliding_windows[layer_id] or 0,
        )


def usable(kernels: CpuKernels | None, kv_cache: KVCache, spec: AttentionSpec) -> bool:
    """Whether :class:`CpuKernelBackend` can run this KV with ``kernels``."""
    return (
        kernels is not None
        and kv_cache.device.type == "cpu"
        and kernels.attention_kernel(kv_cache.dtype, spec.head_dim) is not None
    )
