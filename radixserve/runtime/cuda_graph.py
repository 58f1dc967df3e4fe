"""CudaGraphRunner: decode steps replayed from CUDA graphs (SGLang's CudaGraphRunner, smaller).

An eager decode step of a small model is bound by the host: on the H200 the Qwen2.5-0.5B-shaped
model took 10 ms a step at batch 1, 2.6 ms of it kernels (benchmarks/README.md, "The CUDA
path"). At start this captures the whole decode forward, embeddings to logits, once per batch
size of :func:`capture_batch_sizes`; a decode batch of ``bs`` rows then costs a few copies into
the graph's inputs, FlashInfer's ``plan`` and one replay of the smallest captured size ``>= bs``.
The rows past ``bs`` are padding: token 0 at position 0 with a KV length of 1, its K/V written
to the padding slot 0 (never handed out), its one key read through row 0 of ``req_to_token``.

Batches it does not take run eagerly: extends, batches with LoRA adapters, batches larger than
the largest size (``--cuda-graph-max-bs``). ``--disable-cuda-graph`` turns it off. A verify of
speculative decoding has graphs of its own (``runtime/verify_graph.py``), captured the same way
(:func:`capture_cuda_graph`); :class:`EagerGraph` stands in for a graph where there is no CUDA
(the runners' CPU tests), computing its forward again at each replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Protocol

import torch

from radixserve.models.forward_batch import ForwardBatch, ForwardMode


class GraphModel(Protocol):
    # backend: the attention backend whose wrappers the graphs' plans fill
    def __call__(self, batch: ForwardBatch, backend: Any) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class GraphBackend(Protocol):
    def init_cuda_graphs(self, batch_sizes: list[int], max_context_len: int) -> None: ...

    def init_graph_metadata(self, batch: ForwardBatch) -> None: ...


class Graph(Protocol):
    def replay(self) -> None: ...

    def pool(self) -> Any: ...  # torch's graph pool handle, for the next capture to share


# forward (its output lands in the same tensor at every replay), pool -> (graph, that output)
Capture = Callable[[Callable[[], torch.Tensor], Any], tuple[Graph, torch.Tensor]]


def capture_cuda_graph(
    forward: Callable[[], torch.Tensor], pool: Any
) -> tuple[Graph, torch.Tensor]:
    """``forward`` captured in a CUDA graph (in ``pool``), after two warm-up runs off the
    capturing stream: lazy initialisation (cuBLAS handles and workspaces, FlashInfer's first
    launch) must not land inside the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = forward()
    return graph, output


class EagerGraph:
    """A graph's stand-in with no CUDA: each replay runs ``forward`` again into the output
    tensor the capture returned, reading the inputs' fixed tensors as a replay does."""

    def __init__(self, forward: Callable[[], torch.Tensor]) -> None:
        self._forward = forward
        self.output = forward()

    def replay(self) -> None:
        self.output.copy_(self._forward())

    def pool(self) -> None:
        return None


def capture_eagerly(forward: Callable[[], torch.Tensor], pool: Any) -> tuple[Graph, torch.Tensor]:
    """:data:`Capture` by :class:`EagerGraph`."""
    graph = EagerGraph(forward)
    return graph, graph.output


def capture_sizes(
    sizes: list[int], forward_for: Callable[[int], Callable[[], torch.Tensor]], capture: Capture
) -> tuple[dict[int, Graph], dict[int, torch.Tensor]]:
    """A graph per size of ``forward_for(size)`` (which plans the size's attention first and
    returns its forward), the largest first: the smaller reuse its memory pool."""
    graphs: dict[int, Graph] = {}
    outputs: dict[int, torch.Tensor] = {}
    with torch.inference_mode():
        pool = None
        for size in reversed(sizes):
            graphs[size], outputs[size] = capture(forward_for(size), pool)
            pool = graphs[size].pool()
    return graphs, outputs


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to ``max_bs`` (and ``max_bs`` itself): at most 15 rows of
    padding past 8, about 20 graphs for 256."""
    if max_bs < 1:
        raise ValueError("cuda_graph_max_bs must be >= 1")
    small = [s for s in (1, 2, 4, 8) if s < max_bs]
    return sorted({*small, *range(16, max_bs, 16), max_bs})


class CudaGraphRunner:
    def __init__(
        self,
        model: GraphModel,
        backend: GraphBackend,
        max_bs: int,
        max_context_len: int,
        device: torch.device,
        capture: Capture = capture_cuda_graph,
    ) -> None:
        self.model = model
        self.backend = backend
        self.sizes = capture_batch_sizes(max_bs)
        n = self.sizes[-1]

        def zeros() -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=device)

        # the graphs' inputs: every replay copies its batch into the first rows
        self.input_ids, self.positions, self.out_cache_loc = zeros(), zeros(), zeros()
        self.req_pool_indices, self.seq_lens, self.ones = zeros(), zeros() + 1, zeros() + 1
        backend.init_cuda_graphs(self.sizes, max_context_len)
        # outputs: [size, vocab] logits in the model dtype
        self.graphs, self.outputs = capture_sizes(self.sizes, self._forward_for, capture)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.is_decode and batch.lora is None and batch.batch_size <= self.sizes[-1]

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """The float32 logits ``[bs, vocab]`` after each request's token of ``batch``."""
        bs = batch.batch_size
        size = self.sizes[bisect.bisect_left(self.sizes, bs)]
        for dst, src in (
            (self.input_ids, batch.input_ids),
            (self.positions, batch.positions),
            (self.out_cache_loc, batch.out_cache_loc),
            (self.req_pool_indices, batch.req_pool_indices),
            (self.seq_lens, batch.seq_lens),
        ):
            dst[:bs].copy_(src, non_blocking=True)
        if size > bs:  # padding rows: see the module's docstring
            for t in (self.input_ids, self.positions, self.out_cache_loc, self.req_pool_indices):
                t[bs:size].zero_()
            self.seq_lens[bs:size].fill_(1)
        self.backend.init_graph_metadata(self._batch(size, batch.seq_lens_list + [1] * (size - bs)))
        self.graphs[size].replay()
        return self.outputs[size][:bs].float()

    def _batch(self, size: int, seq_lens_list: list[int]) -> ForwardBatch:
        """The graph inputs' first ``size`` rows as a decode batch."""
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            req_pool_indices=self.req_pool_indices[:size],
            seq_lens=self.seq_lens[:size],
            extend_prefix_lens=self.positions[:size],
            extend_seq_lens=self.ones[:size],
            out_cache_loc=self.out_cache_loc[:size],
            seq_lens_list=seq_lens_list,
            extend_prefix_lens_list=[s - 1 for s in seq_lens_list],
            extend_seq_lens_list=[1] * size,
        )

    def _forward_for(self, bs: int) -> Callable[[], torch.Tensor]:
        """The forward a graph of ``bs`` rows captures, its attention planned."""
        batch = self._batch(bs, [1] * bs)
        self.backend.init_graph_metadata(batch)
        return lambda: self.model.compute_logits(self.model(batch, self.backend))
