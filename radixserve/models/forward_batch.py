"""ForwardBatch: what one model forward computes (docs/design.md, "Model execution").

Memory contract (who writes what):

- The scheduler allocates KV slots for the tokens of this step and writes
  ``req_to_token[req_pool_indices[i], prefix_len_i : seq_len_i] = out_cache_loc[<tokens of i>]``
  *before* calling :meth:`ModelRunner.forward`.
- The attention layers write the new K/V at ``out_cache_loc`` and read each request's whole
  sequence through ``req_to_token[req_pool_indices[i], :seq_len_i]``. Nothing else is written.

Tokens are laid out request after request: request ``i`` owns ``extend_len_i`` consecutive
entries of ``input_ids``/``positions``/``out_cache_loc`` (exactly one in DECODE mode).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.models.lora import LoraBatch
from radixserve.transfer import to_device_packed


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # new tokens of each request on top of a cached prefix (length >= 0)
    DECODE = "decode"  # exactly one new token per request
    # speculative decoding: each request's last token and its drafted tokens, an EXTEND over its
    # cached prefix (causal over the chain) whose every token's logits come back
    VERIFY = "verify"


@dataclass(eq=False, slots=True)
class ForwardBatch:
    """The inputs of one forward. Build it with :meth:`extend` or :meth:`decode`.

    Tensors live on the model's device; the ``*_list`` fields are host copies of the same
    numbers, used to shape metadata without a device-to-host sync.
    """

    forward_mode: ForwardMode
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64: position of each token in its sequence
    req_pool_indices: torch.Tensor  # [bs] int64: each request's row of req_to_token
    seq_lens: torch.Tensor  # [bs] int64: KV length after this step (prefix + extend)
    extend_prefix_lens: torch.Tensor  # [bs] int64: tokens already in the pool (DECODE: seq_len - 1)
    extend_seq_lens: torch.Tensor  # [bs] int64: tokens computed this step (DECODE: 1)
    out_cache_loc: torch.Tensor  # [num_tokens] int64: KV slot written for each token
    seq_lens_list: list[int]
    extend_prefix_lens_list: list[int]
    extend_seq_lens_list: list[int]
    # EXTEND only, per request: None, or an offset ``s`` inside the request's extend tokens; the
    # runner then also returns log P(token[j + 1] | tokens <= j) for extend offsets j in [s, len - 1)
    input_logprob_start: list[int | None] | None = None
    # per request, how many top alternatives each of those prompt positions also returns (rank 0
    # alone reads it: a top-k of logits every rank already has needs no collective)
    input_top_logprobs_num: list[int] | None = None
    # the LoRA adapters of its requests, as segments of its token rows (None: the base alone)
    lora: LoraBatch | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.forward_mode is ForwardMode.DECODE

    @property
    def is_verify(self) -> bool:
        return self.forward_mode is ForwardMode.VERIFY

    @classmethod
    def extend(
        cls,
        input_ids: Sequence[int] | np.ndarray | torch.Tensor,
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        extend_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        device: torch.device | str = "cpu",
        input_logprob_start: Sequence[int | None] | None = None,
    ) -> ForwardBatch:
        """An EXTEND batch: request ``i`` computes ``extend_lens[i] >= 1`` tokens after a cached
        prefix of ``prefix_lens[i] >= 0`` tokens; ``input_ids`` is their concatenation."""
        prefix, ext = list(prefix_lens), list(extend_lens)
        if not (len(prefix) == len(ext) == len(req_pool_indices)) or not ext:
            raise ValueError("an EXTEND batch needs one prefix_len and extend_len per request")
        if min(ext) < 1 or min(prefix) < 0:
            raise ValueError("extend_lens must be >= 1 and prefix_lens >= 0")
        num_tokens = sum(ext)
        if len(input_ids) != num_tokens or len(out_cache_loc) != num_tokens:
            raise ValueError(
                f"{num_tokens} extend tokens but {len(input_ids)} input ids / {len(out_cache_loc)} slots"
            )
        if input_logprob_start is not None:
            starts = list(input_logprob_start)
            if len(starts) != len(ext) or any(
                s is not None and not 0 <= s < e for s, e in zip(starts, ext, strict=True)
            ):
                raise ValueError("input_logprob_start[i] must be None or in [0, extend_len_i)")
            input_logprob_start = starts
        seq = [p + e for p, e in zip(prefix, ext, strict=True)]
        # positions = prefix_i + (0 .. extend_len_i - 1), built on the host from small lists
        ext_t = torch.tensor(ext, dtype=torch.int64)
        starts_t = torch.cumsum(ext_t, 0) - ext_t
        # output_size: without it repeat_interleave sizes its output in a pass of its own
        offsets = torch.arange(num_tokens, dtype=torch.int64) - torch.repeat_interleave(
            starts_t, ext_t, output_size=num_tokens
        )
        positions = offsets + torch.repeat_interleave(
            torch.tensor(prefix, dtype=torch.int64), ext_t, output_size=num_tokens
        )
        ids, pos, slots, rows, seq_t, prefix_t, ext_d = to_device_packed(
            [input_ids, positions, out_cache_loc, req_pool_indices, seq, prefix, ext_t], device
        )
        return cls(
            forward_mode=ForwardMode.EXTEND,
            input_ids=ids,
            positions=pos,
            req_pool_indices=rows,
            seq_lens=seq_t,
            extend_prefix_lens=prefix_t,
            extend_seq_lens=ext_d,
            out_cache_loc=slots,
            seq_lens_list=seq,
            extend_prefix_lens_list=prefix,
            extend_seq_lens_list=ext,
            input_logprob_start=input_logprob_start,
        )

    @classmethod
    def verify(
        cls,
        input_ids: Sequence[int] | np.ndarray | torch.Tensor,
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        verify_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        """A VERIFY batch: laid out as :meth:`extend` (request ``i`` computes ``verify_lens[i]``
        tokens, its last one then its drafts, each row of any length >= 1)."""
        batch = cls.extend(
            input_ids, req_pool_indices, prefix_lens, verify_lens, out_cache_loc, device
        )
        batch.forward_mode = ForwardMode.VERIFY
        return batch

    @classmethod
    def decode(
        cls,
        input_ids: Sequence[int] | np.ndarray | torch.Tensor,
        req_pool_indices: Sequence[int],
        seq_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        """A DECODE batch: one token per request; ``seq_lens[i]`` counts it (KV length after the
        step), so the token sits at position ``seq_lens[i] - 1``. ``input_ids`` may be a device
        tensor (overlap scheduling resolves it without a host sync)."""
        seq = list(seq_lens)
        bs = len(seq)
        if (
            bs == 0
            or len(req_pool_indices) != bs
            or len(input_ids) != bs
            or len(out_cache_loc) != bs
        ):
            raise ValueError("a DECODE batch needs one input id, row, seq_len and slot per request")
        if min(seq) < 1:
            raise ValueError("seq_lens must be >= 1")
        positions = [s - 1 for s in seq]
        ids, rows, seq_t, pos, slots = to_device_packed(
            [input_ids, req_pool_indices, seq, positions, out_cache_loc], device
        )
        return cls(
            forward_mode=ForwardMode.DECODE,
            input_ids=ids,
            positions=pos,
            req_pool_indices=rows,
            seq_lens=seq_t,
            extend_prefix_lens=pos,
            extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=device),
            out_cache_loc=slots,
            seq_lens_list=seq,
            extend_prefix_lens_list=positions,
            extend_seq_lens_list=[1] * bs,
        )
