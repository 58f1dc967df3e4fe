"""Each step's ForwardBatch, sent from rank 0 to the other tensor-parallel ranks.

Rank 0 (the one scheduler) calls :meth:`BatchSender.send` right before its own forward; every
other rank waits in :meth:`BatchReceiver.recv`, then runs the same forward. Two broadcasts
on the control group (always gloo: CPU tensors, so NCCL ranks use it too): a fixed header, then
one int64 payload of the batch's tensors and the ``req_to_token`` rows its attention reads (the
rows up to each sequence's end, as rank 0's table holds them at that moment: prefix hits and
re-cached prefixes included). A header of kind ``STOP`` ends the other ranks' loops; one of
kind ``RELOAD`` (its second field the length) is followed by the UTF-8 path of a checkpoint
every rank stages, then they agree (:func:`all_staged`) before any puts it in its model
(``runtime/weight_update.py``).

Payload layout (``T`` tokens, ``B`` requests, ``L`` the longest sequence)::

    input_ids[T] positions[T] out_cache_loc[T] req_pool_indices[B] seq_lens[B]
    extend_prefix_lens[B] extend_seq_lens[B] input_logprob_start[B] (-1: None) rows[B * L]
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from radixserve.memory_pool import ReqToTokenPool
from radixserve.models.decoder import DecoderForCausalLM
from radixserve.models.forward_batch import ForwardBatch, ForwardMode
from radixserve.models.loader import StagedWeights, stage_weights

_HEADER_LEN = 5  # kind, batch size, tokens, longest sequence, has input_logprob_start


class _Kind(enum.IntEnum):
    STOP = 0
    EXTEND = 1
    DECODE = 2
    VERIFY = 3
    RELOAD = 4


RELOAD_WAIT = datetime.timedelta(minutes=30)  # every rank reading a large checkpoint


@dataclass(frozen=True, slots=True)
class Reload:
    """Rank 0's word to stage the checkpoint in ``model_path`` (a local directory)."""

    model_path: str


def all_staged(control: Any, failed: bool) -> bool:
    """Each rank says whether it failed to stage the checkpoint; True where none did."""
    flag = torch.tensor([int(failed)], dtype=torch.int64)
    control.allreduce(flag, dist.ReduceOp.MAX, RELOAD_WAIT).wait()
    return int(flag) == 0


def stage_on_every_rank(model: DecoderForCausalLM, model_path: str, control: Any) -> StagedWeights:
    """This rank's slice of the checkpoint staged (``stage_weights``), once every rank has
    staged its own; this rank's error, or ``ValueError`` where another rank failed. Every rank
    calls it for the same ``Reload``, so the agreement is reached whatever fails."""
    try:
        staged = stage_weights(model, model_path)
    except BaseException:
        all_staged(control, failed=True)
        raise
    if not all_staged(control, failed=False):
        raise ValueError("a tensor-parallel rank could not load the weights (see its log)")
    return staged


_MODES = {
    _Kind.EXTEND: ForwardMode.EXTEND,
    _Kind.DECODE: ForwardMode.DECODE,
    _Kind.VERIFY: ForwardMode.VERIFY,
}
_KINDS = {mode: kind for kind, mode in _MODES.items()}


def stop_header() -> torch.Tensor:
    """The header that tells the other ranks to leave their loop."""
    return torch.tensor([int(_Kind.STOP)] + [0] * (_HEADER_LEN - 1), dtype=torch.int64)


class BatchSender:
    """Rank 0's side. ``control``: the gloo backend of the group; ``timeout``: how long a send
    may wait for the other ranks."""

    def __init__(
        self, control: Any, req_to_token_pool: ReqToTokenPool, timeout: datetime.timedelta
    ) -> None:
        self.control = control
        self.table = req_to_token_pool.req_to_token
        self.timeout = timeout

    def send(self, batch: ForwardBatch) -> None:
        bs, num_tokens, longest = batch.batch_size, batch.num_tokens, max(batch.seq_lens_list)
        starts = batch.input_logprob_start
        kind = _KINDS[batch.forward_mode]
        header = [int(kind), bs, num_tokens, longest, int(starts is not None)]
        rows = self.table.index_select(0, batch.req_pool_indices.to(self.table.device))
        parts = [
            batch.input_ids,
            batch.positions,
            batch.out_cache_loc,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_prefix_lens,
            batch.extend_seq_lens,
        ]
        if starts is not None:
            parts.append(torch.tensor([-1 if s is None else s for s in starts]))
        parts.append(rows[:, :longest].reshape(-1))
        payload = torch.cat([p.to("cpu", torch.int64) for p in parts])
        self._broadcast(torch.tensor(header, dtype=torch.int64))
        self._broadcast(payload)

    def send_reload(self, model_path: str) -> None:
        data = torch.tensor(list(model_path.encode()), dtype=torch.int64)
        self._broadcast(torch.tensor([int(_Kind.RELOAD), len(data), 0, 0, 0], dtype=torch.int64))
        self._broadcast(data)

    def _broadcast(self, t: torch.Tensor) -> None:
        self.control.broadcast(t, 0, self.timeout).wait()


class BatchReceiver:
    """The side of a rank other than 0: receives a batch and writes the rows it reads into this
    rank's ``req_to_token``, the only table its attention reads."""

    def __init__(self, control: Any, req_to_token_pool: ReqToTokenPool, device: torch.device):
        self.control = control
        self.table = req_to_token_pool.req_to_token
        self.device = device

    def recv(self) -> ForwardBatch | Reload | None:
        """The next batch (or checkpoint to stage), ``None`` when rank 0 said stop. Waits as
        long as rank 0 idles; raises when rank 0 is gone (its connection closes)."""
        header = torch.empty(_HEADER_LEN, dtype=torch.int64)
        self.control.broadcast(header, 0).wait()
        kind, bs, num_tokens, longest, has_starts = header.tolist()
        if kind == _Kind.STOP:
            return None
        if kind == _Kind.RELOAD:
            data = torch.empty(bs, dtype=torch.int64)
            self.control.broadcast(data, 0).wait()
            return Reload(bytes(data.tolist()).decode())
        size = 3 * num_tokens + (5 if has_starts else 4) * bs + bs * longest
        payload = torch.empty(size, dtype=torch.int64)
        self.control.broadcast(payload, 0).wait()
        counts = [num_tokens] * 3 + [bs] * (5 if has_starts else 4) + [bs * longest]
        pieces = list(torch.split(payload, counts))
        rows = pieces.pop().view(bs, longest)
        starts = pieces.pop(7).tolist() if has_starts else None
        ids, pos, loc, pool_idx, seq, prefix, ext = (p.to(self.device) for p in pieces)
        self.table[pool_idx.to(self.table.device), :longest] = rows.to(self.table)
        return ForwardBatch(
            forward_mode=_MODES[_Kind(kind)],
            input_ids=ids,
            positions=pos,
            req_pool_indices=pool_idx,
            seq_lens=seq,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            out_cache_loc=loc,
            seq_lens_list=pieces[4].tolist(),
            extend_prefix_lens_list=pieces[5].tolist(),
            extend_seq_lens_list=pieces[6].tolist(),
            input_logprob_start=None if starts is None else [None if s < 0 else s for s in starts],
        )
