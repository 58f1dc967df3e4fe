"""ModelRunner: the model and its attention backend; runs one ForwardBatch.

It is handed the :class:`KVCache` and the :class:`ReqToTokenPool` that the ``KVManager`` built
(:meth:`KVManager.build`) and owns; it never allocates slots or rows, and reads
``req_to_token`` as the KVManager filled it before :meth:`ModelRunner.forward` (see
:mod:`radixserve.models.forward_batch`).

Under tensor parallelism the runner of rank 0 is handed the :class:`TensorParallelRanks` and
sends each batch to the other ranks right before running it; their runners (``tp_worker.py``)
are handed their :class:`TPGroup` and run what they receive.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool
from radixserve.models.attention.flashinfer_backend import FlashInferBackend
from radixserve.models.attention.registry import create_attention_backend
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.kernels import CpuKernels
from radixserve.models.loader import load_model, reload_weights
from radixserve.models.lora import LoraAdapter, load_adapter
from radixserve.models.numerics import cpu_kernels_for, model_dtype
from radixserve.models.parallel import SINGLE, TPGroup
from radixserve.models.weight_lookup import weight_by_name
from radixserve.runtime.cuda_graph import CudaGraphRunner
from radixserve.runtime.tp_batch import BatchSender, stage_on_every_rank
from radixserve.runtime.tp_ranks import TensorParallelRanks
from radixserve.runtime.verify_graph import VERIFY_GRAPH_MAX_BS, VerifyGraphRunner
from radixserve.transfer import to_device

PROMPT_LOGPROB_CHUNK = 256  # rows per lm_head call for prompt logprobs (~150 MB of fp32 logits)


@dataclass(frozen=True, slots=True)
class LogitsOutput:
    """What one forward returns.

    ``next_token_logits``: float32 ``[bs, vocab]``, the logits after each request's last token
    (raw: no temperature or penalties); for a VERIFY batch ``[num_tokens, vocab]``, after each
    token. ``input_token_logprobs``: for EXTEND batches with
    ``input_logprob_start``, per request ``None`` or a float32 tensor ``[extend_len - 1 - s]``
    holding log P(token[j + 1] | tokens <= j) for extend offsets j = s .. extend_len - 2.
    ``input_top_logprobs``: beside it, per request ``None`` or (values, ids), each
    ``[extend_len - 1 - s, k]`` descending, ``k`` its ``input_top_logprobs_num``.
    """

    next_token_logits: torch.Tensor
    input_token_logprobs: list[torch.Tensor | None] | None = None
    input_top_logprobs: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None


class ModelRunner:
    """Loads ``config.model_path`` and runs forwards over the paged KV memory it is handed."""

    def __init__(
        self,
        config: EngineConfig,
        kv_cache: KVCache,
        req_to_token_pool: ReqToTokenPool,
        cpu_kernels: CpuKernels | None = None,
        *,
        tp_ranks: TensorParallelRanks | None = None,
        tp: TPGroup = SINGLE,
    ) -> None:
        """``cpu_kernels``: what the KV pools were sized for (default: ``cpu_kernels_for``).
        ``tp_ranks`` (rank 0 of a tensor-parallel model) or ``tp`` (another rank): which slice
        of the model to load; default: all of it."""
        if config.model_path is None:
            raise ValueError("ModelRunner needs config.model_path (a local checkpoint directory)")
        if config.execution.num_threads:
            torch.set_num_threads(config.execution.num_threads)
        if cpu_kernels is None:
            cpu_kernels = cpu_kernels_for(config)
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = model_dtype(config, cpu_kernels)
        self.tp_ranks = tp_ranks
        if tp_ranks is not None:
            tp = tp_ranks.group
        self.model, self.model_config = load_model(
            config.model_path,
            self.dtype,
            self.device,
            max_positions=config.max_context_len,
            kernels=cpu_kernels,
            quantization=config.quantization,
            tp=tp,
        )
        if kv_cache.dtype != self.dtype or kv_cache.num_layers != self.model_config.num_layers:
            raise ValueError("the KV cache was not built for this model (dtype or layers differ)")
        self.kv_cache = kv_cache
        self.req_to_token_pool = req_to_token_pool
        self.max_context_len = req_to_token_pool.max_context_len
        self.attn_backend = create_attention_backend(
            config.execution.attention_backend,
            self.model.attention_spec,
            self.kv_cache,
            self.req_to_token_pool,
            cpu_kernels=cpu_kernels,
            decode_tensor_cores=config.execution.flashinfer_decode_tensor_cores,
        )
        self.graphs = self._cuda_graphs(config)
        self.verify_graphs = self._verify_graphs(config)
        self._sender: BatchSender | None = None
        if tp_ranks is not None:
            tp_ranks.wait_loaded()
            self._sender = BatchSender(tp_ranks.control, req_to_token_pool, tp.timeout)

    def _cuda_graphs(self, config: EngineConfig) -> CudaGraphRunner | None:
        """Decode graphs where they apply: CUDA, FlashInfer, one rank, not disabled."""
        if (
            self.device.type != "cuda"
            or config.execution.disable_cuda_graph
            or self.tp_ranks is not None
            or not isinstance(self.attn_backend, FlashInferBackend)
        ):
            return None
        max_bs = min(
            config.execution.cuda_graph_max_bs or 256, config.admission.max_running_requests
        )
        return CudaGraphRunner(
            self.model, self.attn_backend, max_bs, self.max_context_len, self.device
        )

    def _verify_graphs(self, config: EngineConfig) -> VerifyGraphRunner | None:
        """Verify graphs where asked for, with speculative decoding and decode graphs."""
        spec = config.speculative
        if not config.execution.cuda_graph_verify or spec.speculative_algorithm is None:
            return None
        if self.graphs is None or not isinstance(self.attn_backend, FlashInferBackend):
            return None
        max_bs = min(self.graphs.sizes[-1], VERIFY_GRAPH_MAX_BS)
        if spec.speculative_ngram_max_batch_size is not None:  # no drafts above it
            max_bs = min(max_bs, spec.speculative_ngram_max_batch_size)
        return VerifyGraphRunner(
            self.model,
            self.attn_backend,
            max_bs,
            spec.speculative_num_draft_tokens,
            self.max_context_len,
            self.device,
        )

    def check_alive(self) -> None:
        """``RuntimeError`` if a tensor-parallel rank has exited (nothing to check without)."""
        if self.tp_ranks is not None:
            self.tp_ranks.check_alive()

    def shutdown(self) -> None:
        """Stop the other tensor-parallel ranks, if any."""
        if self.tp_ranks is not None:
            self.tp_ranks.shutdown()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def load_lora(self, path: str) -> LoraAdapter:
        """The PEFT adapter at ``path`` in this model's dtype and device (``ValueError`` if it
        cannot apply to this model; ``runtime/lora_manager.py`` calls it)."""
        if self.tp_ranks is not None:
            raise ValueError("LoRA adapters are not served with tensor parallelism (tp_size > 1)")
        max_rank = self.config.lora.max_lora_rank
        return load_adapter(path, self.model_config, self.dtype, self.device, max_rank)

    def update_weights_from_disk(self, model_path: str) -> None:
        """Fill the model in place with the checkpoint at ``model_path`` (``stage_weights``),
        on every tensor-parallel rank once all have staged it; ``ValueError`` where it cannot
        serve as this model (on any rank), whose weights then stay."""
        if self._sender is None:
            reload_weights(self.model, model_path)
            return
        assert self.tp_ranks is not None
        self.tp_ranks.check_alive()
        self._sender.send_reload(model_path)
        stage_on_every_rank(self.model, model_path, self.tp_ranks.control).commit()

    def weight_by_name(self, hf_name: str) -> torch.Tensor:
        """The checkpoint tensor ``hf_name`` as the model holds it now (``weight_lookup.py``)."""
        return weight_by_name(self.model, hf_name)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        """Run ``batch``: K/V of its tokens land at ``batch.out_cache_loc``; the lm_head runs only
        on the last token of each request (plus the prompt rows whose logprobs were asked for)."""
        if max(batch.seq_lens_list) > self.max_context_len:
            raise ValueError(f"a sequence exceeds the context length {self.max_context_len}")
        if self._sender is not None:  # the other ranks run the same batch
            assert self.tp_ranks is not None
            self.tp_ranks.check_alive()
            self._sender.send(batch)
        if self.graphs is not None and self.graphs.can_run(batch):
            return LogitsOutput(self.graphs.replay(batch))
        if self.verify_graphs is not None and self.verify_graphs.can_run(batch):
            return LogitsOutput(self.verify_graphs.replay(batch))
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch, self.attn_backend)  # [num_tokens, hidden]
        if batch.is_decode or batch.is_verify:  # a verify scores every token it computed
            return LogitsOutput(self.model.compute_logits(hidden).float())
        ends = [n - 1 for n in itertools.accumulate(batch.extend_seq_lens_list)]
        last = hidden.index_select(0, to_device(ends, self.device))
        next_token_logits = self.model.compute_logits(last).float()
        starts = batch.input_logprob_start
        if starts is None or all(s is None for s in starts):
            return LogitsOutput(next_token_logits)
        return self._prompt_logprobs(next_token_logits, hidden, batch, ends, starts)

    def _prompt_logprobs(
        self,
        next_token_logits: torch.Tensor,
        hidden: torch.Tensor,
        batch: ForwardBatch,
        ends: list[int],
        starts: list[int | None],
    ) -> LogitsOutput:
        """Per request, log P(token[j + 1] | tokens <= j) for extend offsets j in [s, len - 1),
        and the top ``input_top_logprobs_num`` of each of those positions, the lm_head run over
        ``PROMPT_LOGPROB_CHUNK`` rows at a time to bound memory."""
        rows: list[int] = []  # token rows of hidden whose next token is scored
        spans: list[tuple[int, int] | None] = []  # per request: (first entry in rows, count)
        for s, n, end in zip(starts, batch.extend_seq_lens_list, ends, strict=True):
            if s is None:
                spans.append(None)
                continue
            first = end - n + 1 + s  # the row of extend offset s
            spans.append((len(rows), end - first))
            rows.extend(range(first, end))
        rows_t = to_device(rows, self.device)
        targets = batch.input_ids.index_select(0, rows_t + 1)  # the token each row predicts
        nums = batch.input_top_logprobs_num or [0] * len(starts)
        k = min(
            max((n for n, sp in zip(nums, spans, strict=True) if sp), default=0), self.vocab_size
        )
        out = torch.empty(len(rows), dtype=torch.float32, device=self.device)
        top_v = torch.empty(len(rows), k, dtype=torch.float32, device=self.device)
        top_i = torch.empty(len(rows), k, dtype=torch.int64, device=self.device)
        for i in range(0, len(rows), PROMPT_LOGPROB_CHUNK):
            chunk = slice(i, i + PROMPT_LOGPROB_CHUNK)
            logits = self.model.compute_logits(hidden.index_select(0, rows_t[chunk])).float()
            logprobs = torch.log_softmax(logits, dim=-1)
            out[chunk] = logprobs.gather(1, targets[chunk, None]).squeeze(1)
            if k:
                top_v[chunk], top_i[chunk] = logprobs.topk(k, dim=-1)
        values = [None if sp is None else out[sp[0] : sp[0] + sp[1]] for sp in spans]
        tops: list[tuple[torch.Tensor, torch.Tensor] | None] = [
            None
            if sp is None or not n
            else (top_v[sp[0] : sp[0] + sp[1], :n], top_i[sp[0] : sp[0] + sp[1], :n])
            for sp, n in zip(spans, nums, strict=True)
        ]
        return LogitsOutput(next_token_logits, values, tops if k else None)
