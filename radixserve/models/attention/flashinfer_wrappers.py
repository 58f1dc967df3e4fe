"""FlashInfer's wrappers as :class:`~radixserve.models.attention.flashinfer_backend.
FlashInferBackend` uses them: :class:`FlashInferWrappers` (the real ones, sharing one workspace
buffer; ``flashinfer`` is imported there, lazily), the :class:`WrapperFactory` protocol they and
the torch reference wrappers (``paged_reference.py``) implement, which decode kernels run
(:func:`decode_on_tensor_cores`) and the fixed buffers the wrappers a CUDA graph captures read
(:class:`GraphBuffers`: a decode's, and a verify's paged prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from radixserve.models.attention.base import AttentionSpec

WORKSPACE_BYTES = 128 * 1024 * 1024


class WrapperFactory(Protocol):
    def prefill(self) -> Any: ...

    def decode(self) -> Any: ...

    def ragged(self) -> Any: ...

    def merge_state(
        self, v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def graph_decode(self, buffers: GraphBuffers, bs: int) -> Any: ...

    def graph_prefill(self, buffers: GraphBuffers, bs: int) -> Any: ...

    def fast_decode_plan(
        self, wrapper: Any, indptr: torch.Tensor, *args: Any, max_kv_len: int, **kwargs: Any
    ) -> None: ...


def decode_on_tensor_cores(spec: AttentionSpec, override: bool | None = None) -> bool:
    """Whether FlashInfer's decode runs on tensor cores: ``override`` where given, else for GQA
    groups other than 1, 2, 4 and 8 (the CUDA-core kernels FlashInfer builds; SGLang takes
    tensor cores from groups of 4 on)."""
    if override is not None:
        return override
    return spec.group_size not in (1, 2, 4, 8)


class FlashInferWrappers:
    """Real FlashInfer wrappers sharing one workspace buffer."""

    def __init__(
        self, spec: AttentionSpec, device: torch.device, tensor_cores: bool | None = None
    ) -> None:
        import flashinfer  # optional extra [gpu]

        self._flashinfer = flashinfer
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.use_tensor_cores = decode_on_tensor_cores(spec, tensor_cores)

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

    def ragged(self) -> Any:
        return self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )

    def merge_state(
        self, v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        merged: tuple[torch.Tensor, torch.Tensor] = self._flashinfer.merge_state(v_a, s_a, v_b, s_b)
        return merged

    def fast_decode_plan(
        self, wrapper: Any, indptr: torch.Tensor, *args: Any, max_kv_len: int, **kwargs: Any
    ) -> None:
        """FlashInfer's ``fast_decode_plan`` (SGLang's, upstreamed): a graph wrapper's ``plan``
        that copies nothing into its buffers (the caller wrote them) and takes the host indptr
        as it is. The full ``plan`` of a tensor-core wrapper also takes Python's ``max`` over
        the KV lengths, a host tensor: one comparison op per request, every step; the fast one
        leaves the wrapper's ``_max_kv_len`` as it was, so it is set here from the caller's
        lists (``run`` hands it to some kernels)."""
        fast_plan = self._flashinfer.decode.fast_decode_plan  # in the pinned 0.6.18
        fast_plan(wrapper, indptr, *args, global_override_indptr_cpu=indptr, **kwargs)
        if getattr(wrapper, "_max_kv_len", None) is not None:
            wrapper._max_kv_len = max_kv_len

    def graph_decode(self, buffers: GraphBuffers, bs: int) -> Any:
        """A decode wrapper a CUDA graph of batch size ``bs`` captures: its page table lives in
        ``buffers`` (shared by every size; ``plan`` fills them before each replay)."""
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores,
            paged_kv_indptr_buffer=buffers.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=buffers.kv_indices,
            paged_kv_last_page_len_buffer=buffers.kv_last_page_len[:bs],
        )

    def graph_prefill(self, buffers: GraphBuffers, bs: int) -> Any:
        """A paged prefill wrapper a CUDA graph of a verify over ``bs`` requests captures: its
        query and page tables live in ``buffers``. In this mode FlashInfer's ``plan`` copies the
        tables into them, and takes the same ``bs`` and at most its first plan's query rows."""
        return self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=buffers.qo_indptr[: bs + 1],
            paged_kv_indptr_buf=buffers.kv_indptr[: bs + 1],
            paged_kv_indices_buf=buffers.kv_indices,
            paged_kv_last_page_len_buf=buffers.kv_last_page_len[:bs],
            backend="fa2",
        )


@dataclass(frozen=True, slots=True)
class GraphBuffers:
    """The fixed device buffers the captured kernels read their query and page tables from
    (a decode's kernels read no query table)."""

    kv_indptr: torch.Tensor  # [max_bs + 1] int32
    kv_indices: torch.Tensor  # [max_bs * max_context_len + extra] int32: any batch's table
    kv_last_page_len: torch.Tensor  # [max_bs] int32
    qo_indptr: torch.Tensor  # [max_bs + 1] int32

    @classmethod
    def allocate(
        cls, max_bs: int, max_context_len: int, device: torch.device, extra_indices: int = 0
    ) -> GraphBuffers:
        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int32, device=device)

        indices = zeros(max_bs * max_context_len + extra_indices)
        return cls(zeros(max_bs + 1), indices, zeros(max_bs) + 1, zeros(max_bs + 1))
