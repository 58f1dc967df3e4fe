"""ModelRunner: the model, its KV memory and its attention backend; runs one ForwardBatch.

It owns the :class:`KVCache` and the :class:`ReqToTokenPool` (sized here, from the config) but
never allocates slots or rows: the scheduler does, and fills ``req_to_token`` before
:meth:`ModelRunner.forward` (see :mod:`radixserve.runtime.forward_batch`). The scheduler builds
its ``TokenToKVPoolAllocator(runner.num_kv_slots, config.page_size)`` over the same slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.config import EngineConfig
from radixserve.memory_pool import KVCache, ReqToTokenPool, num_slots_for_budget
from radixserve.models.attention.registry import create_attention_backend
from radixserve.models.loader import load_model, resolve_dtype
from radixserve.runtime.forward_batch import ForwardBatch


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
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model, self.model_config = load_model(
            config.model_path, self.dtype, self.device, max_positions=config.max_context_len
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
        ext = batch.extend_seq_lens_list
        ends, acc = [], 0
        for e in ext:
            acc += e
            ends.append(acc - 1)
        starts = batch.input_logprob_start
        if starts is None or all(s is None for s in starts):
            last = hidden.index_select(0, torch.tensor(ends, device=self.device))
            return LogitsOutput(self.model.compute_logits(last).float())
        # one lm_head over [last rows of every request] + [prompt rows that want logprobs]
        rows = list(ends)
        spans: list[tuple[int, int] | None] = []
        for s, e, end in zip(starts, ext, ends, strict=True):
            if s is None:
                spans.append(None)
                continue
            first = end - e + 1 + s  # token offset s of this request
            spans.append((len(rows), end - first))
            rows.extend(range(first, end))
        logits = self.model.compute_logits(
            hidden.index_select(0, torch.tensor(rows, device=self.device))
        ).float()
        bs = len(ext)
        extra_rows = torch.tensor(rows[bs:], device=self.device)
        targets = batch.input_ids.index_select(0, extra_rows + 1)  # the token each row predicts
        logprobs = torch.log_softmax(logits[bs:], dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
        per_req = [
            None if sp is None else logprobs[sp[0] - bs : sp[0] - bs + sp[1]] for sp in spans
        ]
        return LogitsOutput(logits[:bs], per_req)
