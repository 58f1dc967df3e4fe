"""ModelRunner: the model, its KV memory and its attention backend; runs one ForwardBatch.

It owns the :class:`KVCache` and the :class:`ReqToTokenPool` (sized here, from the config) but
never allocates slots or rows: the scheduler does, and fills ``req_to_token`` before
:meth:`ModelRunner.forward` (see :mod:`radixserve.models.forward_batch`). The scheduler builds
its ``TokenToKVPoolAllocator(runner.num_kv_slots, config.page_size)`` over the same slots.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool, num_slots_for_budget
from radixserve.models.attention.registry import create_attention_backend
from radixserve.models.forward_batch import ForwardBatch
from radixserve.models.kernels import TORCH_ONLY, CpuKernels
from radixserve.models.loader import load_model, resolve_dtype

PROMPT_LOGPROB_CHUNK = 256  # rows per lm_head call for prompt logprobs (~150 MB of fp32 logits)


@dataclass(frozen=True, slots=True)
class LogitsOutput:
    """What one forward returns.

    ``next_token_logits``: float32 ``[bs, vocab]``, the logits after each request's last token
    (raw: no temperature or penalties). ``input_token_logprobs``: for EXTEND batches with
    ``input_logprob_start``, per request ``None`` or a float32 tensor ``[extend_len - 1 - s]``
    holding log P(token[j + 1] | tokens <= j) for extend offsets j = s .. extend_len - 2.
    """

    next_token_logits: torch.Tensor
    input_token_logprobs: list[torch.Tensor | None] | None = None


class ModelRunner:
    """Loads ``config.model_path`` and runs forwards over the paged KV memory."""

    def __init__(self, config: EngineConfig) -> None:
        if config.model_path is None:
            raise ValueError("ModelRunner needs config.model_path (a local checkpoint directory)")
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        cpu_kernels = TORCH_ONLY
        if torch.device(config.device).type == "cpu":
            # build or load this CPU's kernel variant now, not on the first step (falls back
            # silently to the torch paths)
            cpu_kernels = CpuKernels.build(
                config.cpu_isa,
                dense=not config.disable_cpu_linear_kernel,
                attention=not config.disable_cpu_attention_kernel,
            )
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device, cpu_kernels)
        self.model, self.model_config = load_model(
            config.model_path,
            self.dtype,
            self.device,
            max_positions=config.max_context_len,
            kernels=cpu_kernels,
            quantization=config.quantization,
        )
        mc = self.model_config
        self.max_context_len = config.max_context_len or mc.max_position_embeddings
        page = config.page_size
        if config.max_total_tokens is not None:
            if config.max_total_tokens < 1:
                raise ValueError("max_total_tokens must be >= 1")
            # usable slots rounded up to whole pages, plus the reserved padding page
            self.num_kv_slots = (-(-config.max_total_tokens // page) + 1) * page
        else:
            self.num_kv_slots = num_slots_for_budget(
                config.kv_cache_bytes, mc.num_layers, mc.num_kv_heads, mc.head_dim, self.dtype, page
            )
        self.kv_cache = KVCache(
            mc.num_layers, self.num_kv_slots, mc.num_kv_heads, mc.head_dim, self.dtype, self.device
        )
        self.req_to_token_pool = ReqToTokenPool(
            config.max_running_requests, self.max_context_len, self.device
        )
        self.attn_backend = create_attention_backend(
            config.attention_backend,
            self.model.attention_spec,
            self.kv_cache,
            self.req_to_token_pool,
            cpu_kernels=cpu_kernels,
        )

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        """Run ``batch``: K/V of its tokens land at ``batch.out_cache_loc``; the lm_head runs only
        on the last token of each request (plus the prompt rows whose logprobs were asked for)."""
        if max(batch.seq_lens_list) > self.max_context_len:
            raise ValueError(f"a sequence exceeds the context length {self.max_context_len}")
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch, self.attn_backend)  # [num_tokens, hidden]
        if batch.is_decode:
            return LogitsOutput(self.model.compute_logits(hidden).float())
        ends = [n - 1 for n in itertools.accumulate(batch.extend_seq_lens_list)]
        last = hidden.index_select(0, torch.tensor(ends, device=self.device))
        next_token_logits = self.model.compute_logits(last).float()
        starts = batch.input_logprob_start
        if starts is None or all(s is None for s in starts):
            return LogitsOutput(next_token_logits)
        return LogitsOutput(next_token_logits, self._prompt_logprobs(hidden, batch, ends, starts))

    def _prompt_logprobs(
        self, hidden: torch.Tensor, batch: ForwardBatch, ends: list[int], starts: list[int | None]
    ) -> list[torch.Tensor | None]:
        """Per request, log P(token[j + 1] | tokens <= j) for extend offsets j in [s, len - 1),
        the lm_head run over ``PROMPT_LOGPROB_CHUNK`` rows at a time to bound memory."""
        rows: list[int] = []  # token rows of hidden whose next token is scored
        spans: list[tuple[int, int] | None] = []  # per request: (first entry in rows, count)
        for s, n, end in zip(starts, batch.extend_seq_lens_list, ends, strict=True):
            if s is None:
                spans.append(None)
                continue
            first = end - n + 1 + s  # the row of extend offset s
            spans.append((len(rows), end - first))
            rows.extend(range(first, end))
        rows_t = torch.tensor(rows, dtype=torch.int64, device=self.device)
        targets = batch.input_ids.index_select(0, rows_t + 1)  # the token each row predicts
        out = torch.empty(len(rows), dtype=torch.float32, device=self.device)
        for i in range(0, len(rows), PROMPT_LOGPROB_CHUNK):
            chunk = slice(i, i + PROMPT_LOGPROB_CHUNK)
            logits = self.model.compute_logits(hidden.index_select(0, rows_t[chunk])).float()
            out[chunk] = (
                torch.log_softmax(logits, dim=-1).gather(1, targets[chunk, None]).squeeze(1)
            )
        return [None if sp is None else out[sp[0] : sp[0] + sp[1]] for sp in spans]
