"""ScheduleBatch: the requests of one forward, and how their KV slots are laid out for it."""

from __future__ import annotations

import numpy as np
import torch

from radixserve.models.forward_batch import ForwardBatch, ForwardMode
from radixserve.policy import Admission
from radixserve.types import Req


class ScheduleBatch:
    """An EXTEND or DECODE batch over ``reqs``.

    ``extend``/``decode`` build the :class:`ForwardBatch` over slots the ``KVManager`` has
    allocated (it owns all allocation). The running batch of decoding requests is kept with
    :meth:`filter` and :meth:`merge`.
    """

    def __init__(self, reqs: list[Req], mode: ForwardMode = ForwardMode.DECODE) -> None:
        self.reqs = reqs
        self.mode = mode
        self.forward_batch: ForwardBatch | None = None
        # per request: does this forward sample its next token? (not for mid-prompt chunks)
        self.samples: list[bool] = []
        # per request: the next prompt token, when a mid-prompt chunk must report its logprob
        self.boundary_targets: list[int | None] = []
        # the requests from this index on stay in the running batch (0: all of them, a verify or
        # a grammar's forced tokens; the running requests a mixed prefill carries; None: none)
        self.running_from: int | None = None
        # VERIFY: each request's drafted tokens (int32), verified after its last token
        self.drafts: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.reqs)

    def __bool__(self) -> bool:
        return bool(self.reqs)

    @property
    def is_decode(self) -> bool:
        return self.mode is ForwardMode.DECODE

    @property
    def is_verify(self) -> bool:
        return self.mode is ForwardMode.VERIFY

    def stays_running(self, i: int) -> bool:
        """Whether request ``i`` was running before this forward and stays in the running batch
        (otherwise an extend's request joins it once its prompt is done)."""
        return self.running_from is not None and i >= self.running_from

    @property
    def has_grammar(self) -> bool:
        return any(r.grammar for r in self.reqs)

    @classmethod
    def extend(
        cls,
        admissions: list[Admission],
        slots: torch.Tensor,
        device: torch.device,
        running_from: int | None = None,
    ) -> ScheduleBatch:
        """Each request computes ``fill_ids[kv_len - extend_len : kv_len]``: the ``slots`` that
        ``KVManager.alloc_extend`` (or ``alloc_decode``) gave (the rows already point at them).
        ``running_from``: see :meth:`stays_running`."""
        reqs = [a.req for a in admissions]
        extend_lens = [a.extend_len for a in admissions]
        prefix_lens = [r.kv_len - n for r, n in zip(reqs, extend_lens, strict=True)]
        pieces: list[np.ndarray] = []
        starts: list[int | None] = []
        for req, start, n in zip(reqs, prefix_lens, extend_lens, strict=True):
            pieces.append(req.fill_ids[start : start + n])
            starts.append(_input_logprob_start(req, start, n))
        batch = cls(reqs, ForwardMode.EXTEND)
        batch.running_from = running_from
        batch.samples = [r.kv_len == r.seq_len for r in reqs]
        batch.boundary_targets = [
            _boundary_target(r, s) for r, s in zip(reqs, batch.samples, strict=True)
        ]
        batch.forward_batch = ForwardBatch.extend(
            np.concatenate(pieces),
            [r.req_pool_idx for r in reqs],  # type: ignore[misc]
            prefix_lens,
            extend_lens,
            slots,
            device,
            input_logprob_start=starts if any(s is not None for s in starts) else None,
        )
        batch.forward_batch.input_top_logprobs_num = [
            r.top_logprobs_num if r.return_logprob else 0 for r in reqs
        ]
        return batch

    def decode(self, slots: torch.Tensor, device: torch.device) -> ScheduleBatch:
        """One new token per request (``slots`` from ``KVManager.alloc_decode``): the last
        sampled one, read from the token buffer at run time (``input_ids`` are placeholders)."""
        batch = ScheduleBatch(list(self.reqs), ForwardMode.DECODE)
        batch.samples = [True] * len(self.reqs)
        batch.boundary_targets = [None] * len(self.reqs)
        batch.forward_batch = ForwardBatch.decode(
            torch.zeros(len(self.reqs), dtype=torch.int64),
            [r.req_pool_idx for r in self.reqs],  # type: ignore[misc]
            [r.kv_len for r in self.reqs],
            slots,
            device,
        )
        return batch

    def verify(
        self, drafts: list[np.ndarray], slots: torch.Tensor, device: torch.device
    ) -> ScheduleBatch:
        """Each request's last token then its ``drafts`` (any length, none included) in one
        VERIFY forward over ``slots`` (``KVManager.alloc_decode`` gave ``1 + len(draft)`` each);
        the requests stay in the running batch."""
        lens = [1 + d.shape[0] for d in drafts]
        prefix_lens = [r.kv_len - n for r, n in zip(self.reqs, lens, strict=True)]
        pieces: list[np.ndarray] = []
        for req, draft, start in zip(self.reqs, drafts, prefix_lens, strict=True):
            assert start == req.seq_len - 1, "a verify follows a request's every computed token"
            pieces += [req.fill_ids[start:], draft]
        batch = ScheduleBatch(list(self.reqs), ForwardMode.VERIFY)
        batch.running_from = 0
        batch.samples = [True] * len(self.reqs)
        batch.boundary_targets = [None] * len(self.reqs)
        batch.drafts = drafts
        batch.forward_batch = ForwardBatch.verify(
            np.concatenate(pieces),
            [r.req_pool_idx for r in self.reqs],  # type: ignore[misc]
            prefix_lens,
            lens,
            slots,
            device,
        )
        return batch

    def new_token_lens(self) -> list[int] | None:
        """Tokens each request computes next: ``None`` when one each (a decode), else
        ``seq_len - kv_len`` (a grammar's forced tokens; every token must be known)."""
        lens = [r.seq_len - r.kv_len for r in self.reqs]
        return lens if any(n > 1 for n in lens) else None

    def next_step(
        self,
        slots: torch.Tensor,
        lens: list[int] | None,
        device: torch.device,
        drafts: list[np.ndarray] | None = None,
    ) -> ScheduleBatch:
        """The running batch's next forward over ``slots``: a decode, with ``drafts`` a verify,
        or with ``lens`` (see :meth:`new_token_lens`) one extend of a grammar's forced tokens
        that keeps them running."""
        if drafts is not None:
            return self.verify(drafts, slots, device)
        if lens is None:
            return self.decode(slots, device)
        admissions = [Admission(r, None, n) for r, n in zip(self.reqs, lens, strict=True)]
        return ScheduleBatch.extend(admissions, slots, device, running_from=0)

    def drop_done(self, max_context_len: int) -> None:
        """Requests that finished, or whose last token is already scheduled (length, context),
        leave the running batch; their in-flight result finishes them."""
        self.filter(
            drop={
                r
                for r in self.reqs
                if r.is_finished
                # output tokens once every scheduled step is done
                or r.kv_len - r.prompt_len + 1 >= r.max_new_tokens
                or r.kv_len + 1 > max_context_len
            }
        )

    def filter(self, drop: set[Req]) -> None:
        self.reqs = [r for r in self.reqs if r not in drop]

    def merge(self, reqs: list[Req]) -> None:
        self.reqs.extend(reqs)


def _input_logprob_start(req: Req, start: int, extend_len: int) -> int | None:
    """Offset inside this extend from which prompt-token logprobs are computed, or ``None``."""
    if req.logprob_start_len < 0 or req.output_ids:  # a resumed request had them already
        return None
    first = max(req.logprob_start_len, 1) - 1  # the position whose logits predict the first token
    offset = max(first - start, 0)
    return offset if offset < extend_len - 1 else None


def _boundary_target(req: Req, samples: bool) -> int | None:
    if samples or req.logprob_start_len < 0 or req.output_ids:
        return None
    return int(req.fill_ids[req.kv_len]) if req.kv_len >= max(req.logprob_start_len, 1) else None
