"""Tensor parallelism inside the model: who holds which slice, and the two collectives.

A :class:`TPGroup` is one rank's view of a tensor-parallel group (rank, size, and the c10d
backend its collectives run on: gloo on CPU, NCCL on CUDA, built by the runtime). The decoder
is built from it: column-parallel QKV and gate/up (each rank holds its heads / columns),
row-parallel o_proj and down_proj (one :meth:`TPGroup.all_reduce` each), a vocab-parallel
embedding (an all-reduce) and LM head (:meth:`TPGroup.all_gather`). :data:`SINGLE` is the null
object of ``tp_size == 1``: the decoder then calls no collective at all.

KV heads are split across ranks when there are at least as many as ranks, and replicated
otherwise (each rank keeps the one KV head its query heads read). :func:`check_tp_shapes`
refuses a model whose head counts do not divide.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.models.model_config import ModelConfig


@dataclass(frozen=True, slots=True, eq=False)
class TPGroup:
    """One rank of a tensor-parallel group. ``backend``: a c10d ``Backend`` (ProcessGroupGloo
    or ProcessGroupNCCL) shared by the ranks; ``None`` only for the single rank of size 1."""

    rank: int = 0
    size: int = 1
    backend: Any = None
    timeout: datetime.timedelta = datetime.timedelta(seconds=120)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.size}")
        if self.size > 1 and self.backend is None:
            raise ValueError("a tensor-parallel group of more than one rank needs a backend")

    @property
    def is_parallel(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        if self.size > 1:
            self.backend.allreduce(x, torch.distributed.ReduceOp.SUM, self.timeout).wait()
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[n, k]`` of every rank -> ``[n, size * k]``, rank 0's columns first."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.backend.allgather(parts, x, self.timeout).wait()
        return torch.cat(parts, dim=-1)

    def split(self, n: int) -> tuple[int, int]:
        """``(start, count)`` of this rank's equal part of ``n`` (``n`` divisible by size)."""
        count = n // self.size
        return self.rank * count, count

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """``(first KV head, count)`` this rank holds: its share, or the one head its query
        heads read when there are fewer KV heads than ranks (replicated)."""
        if num_kv_heads >= self.size:
            return self.split(num_kv_heads)
        return self.rank * num_kv_heads // self.size, 1

    def vocab_shard(self, vocab_size: int) -> tuple[int, int, int]:
        """``(start, rows, padded rows)`` of this rank's vocabulary slice: every rank holds
        ``ceil(vocab / size)`` rows, the last ones zero where the vocabulary ends."""
        padded = -(-vocab_size // self.size)
        start = min(self.rank * padded, vocab_size)
        return start, min(padded, vocab_size - start), padded


SINGLE = TPGroup()
"""No tensor parallelism: every weight whole, no collective."""


def local_num_kv_heads(num_kv_heads: int, tp_size: int) -> int:
    """KV heads one rank's pool holds (the same on every rank)."""
    return num_kv_heads // tp_size if num_kv_heads >= tp_size else 1


def check_tp_shapes(cfg: ModelConfig, tp_size: int) -> None:
    """``ValueError`` unless ``cfg``'s heads and MLP split evenly over ``tp_size`` ranks."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if tp_size == 1:
        return
    problems = []
    if cfg.num_heads % tp_size:
        problems.append(f"num_attention_heads {cfg.num_heads}")
    kv = cfg.num_kv_heads
    if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
        problems.append(f"num_key_value_heads {kv} (nor does tp_size divide by it)")
    if cfg.intermediate_size % tp_size:
        problems.append(f"intermediate_size {cfg.intermediate_size}")
    if problems:
        raise ValueError(f"tp_size {tp_size} does not divide {', '.join(problems)}")
