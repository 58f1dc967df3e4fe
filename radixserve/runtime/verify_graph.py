"""VerifyGraphRunner: speculative decoding's verify forwards replayed from CUDA graphs.

An eager verify on the H200 cost about 4.6 plain decode steps of the small model (the host
launching every kernel), so the cost model drafted little beyond batch 1 (docs/speculative.md).
As SGLang captures its target-verify forwards, this captures the whole verify forward,
embeddings to the logits of every token, once per batch size ``S`` of
:func:`~radixserve.runtime.cuda_graph.capture_batch_sizes` (up to ``max_bs``), over a fixed
``S * n + 1`` tokens where ``n`` is ``speculative_num_draft_tokens`` (a request's last token and
at most ``n - 1`` drafts) and ``S + 1`` requests:

- the batch's requests first, each with its own number of tokens (drafts vary per request);
- then one token over one KV slot for each padding request up to ``S``;
- then the last request, which takes every token left (at least one) over as many KV slots.

Padding tokens are token 0 at position 0, their K/V written to the padding slot 0, which every
padding request's page table holds alone; their logits are never read. Each replay copies the
batch into the graph's inputs and plans FlashInfer's paged prefill wrappers (in CUDA-graph mode:
the same number of requests, at most the captured query rows, the tables in fixed buffers).

Batches it does not take run eagerly: more requests than the largest size, a request with more
than ``n`` tokens, LoRA adapters. ``--cuda-graph-verify`` turns it on (off by default until a
GPU run has measured it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

import torch

from radixserve.models.forward_batch import ForwardBatch, ForwardMode
from radixserve.runtime.cuda_graph import (
    Capture,
    GraphModel,
    capture_batch_sizes,
    capture_cuda_graph,
    capture_sizes,
)

VERIFY_GRAPH_MAX_BS = 64  # the default largest size: above it the cost model rarely drafts


class VerifyGraphBackend(Protocol):
    def init_verify_graphs(
        self, batch_sizes: list[int], max_tokens: int, max_context_len: int
    ) -> None: ...

    def init_verify_graph_metadata(self, batch: ForwardBatch, num_real: int) -> None: ...


def padded_layout(
    extend_lens: list[int], seq_lens: list[int], size: int, num_tokens: int
) -> tuple[list[int], list[int]]:
    """The query and KV lengths of a graph of ``size`` (``size + 1`` requests, ``num_tokens``
    tokens) holding a batch of ``extend_lens`` / ``seq_lens`` (see the module's docstring)."""
    bs = len(extend_lens)
    rest = num_tokens - sum(extend_lens) - (size - bs)
    if bs > size or rest < 1:
        raise ValueError(f"a verify of {bs} requests, {sum(extend_lens)} tokens exceeds {size}")
    pad = [1] * (size - bs) + [rest]
    return extend_lens + pad, seq_lens + pad


class VerifyGraphRunner:
    def __init__(
        self,
        model: GraphModel,
        backend: VerifyGraphBackend,
        max_bs: int,
        tokens_per_request: int,
        max_context_len: int,
        device: torch.device,
        capture: Capture = capture_cuda_graph,
    ) -> None:
        self.model = model
        self.backend = backend
        self.tokens_per_request = tokens_per_request
        self.sizes = capture_batch_sizes(max_bs)
        tokens, rows = self.num_tokens(self.sizes[-1]), self.sizes[-1] + 1

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=device)

        # the graphs' inputs: every replay copies its batch into the first rows
        self.input_ids, self.positions, self.out_cache_loc = (
            zeros(tokens),
            zeros(tokens),
            zeros(tokens),
        )
        self.req_pool_indices, self.seq_lens, self.unread = zeros(rows), zeros(rows), zeros(rows)
        backend.init_verify_graphs(self.sizes, tokens, max_context_len)
        # outputs: [tokens, vocab] logits in the model dtype
        self.graphs, self.outputs = capture_sizes(self.sizes, self._forward_for, capture)

    def num_tokens(self, size: int) -> int:
        """The tokens a graph of ``size`` requests computes."""
        return size * self.tokens_per_request + 1

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.is_verify
            and batch.lora is None
            and batch.batch_size <= self.sizes[-1]
            and max(batch.extend_seq_lens_list) <= self.tokens_per_request
        )

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """The float32 logits ``[num_tokens, vocab]`` after each token of ``batch``."""
        bs, n = batch.batch_size, batch.num_tokens
        size = self.sizes[bisect.bisect_left(self.sizes, bs)]
        total = self.num_tokens(size)
        for dst, src in (
            (self.input_ids, batch.input_ids),
            (self.positions, batch.positions),
            (self.out_cache_loc, batch.out_cache_loc),
        ):
            dst[:n].copy_(src, non_blocking=True)
            dst[n:total].zero_()
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices, non_blocking=True)
        self.seq_lens[:bs].copy_(batch.seq_lens, non_blocking=True)
        qo, kv = padded_layout(batch.extend_seq_lens_list, batch.seq_lens_list, size, total)
        self.backend.init_verify_graph_metadata(self._batch(size, qo, kv), bs)
        self.graphs[size].replay()
        return self.outputs[size][:n].float()

    def _batch(self, size: int, qo: list[int], kv: list[int]) -> ForwardBatch:
        """The graph inputs as a verify batch of ``size + 1`` requests of ``qo`` tokens over
        ``kv`` KV slots. Only the backend reads its request tensors, and of them only the real
        requests' rows and lengths: ``extend_*`` tensors are left unfilled."""
        rows, total = size + 1, sum(qo)
        return ForwardBatch(
            forward_mode=ForwardMode.VERIFY,
            input_ids=self.input_ids[:total],
            positions=self.positions[:total],
            req_pool_indices=self.req_pool_indices[:rows],
            seq_lens=self.seq_lens[:rows],
            extend_prefix_lens=self.unread[:rows],
            extend_seq_lens=self.unread[:rows],
            out_cache_loc=self.out_cache_loc[:total],
            seq_lens_list=kv,
            extend_prefix_lens_list=[k - q for k, q in zip(kv, qo, strict=True)],
            extend_seq_lens_list=qo,
        )

    def _forward_for(self, size: int) -> Callable[[], torch.Tensor]:
        """The forward a graph of ``size`` captures (padding alone), its attention planned."""
        qo, kv = padded_layout([], [], size, self.num_tokens(size))
        batch = self._batch(size, qo, kv)
        self.backend.init_verify_graph_metadata(batch, 0)
        return lambda: self.model.compute_logits(self.model(batch, self.backend))
