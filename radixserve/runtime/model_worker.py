"""ModelWorker: runs a ScheduleBatch (forward + sample), inline or overlapped with scheduling.

The sampled token of each request row is written into ``last_token[row]``; a DECODE batch reads
its input ids from there when it runs, so batch N+1 can be prepared (and queued behind N in the
single worker thread) before N's tokens reach the scheduler: no host sync between them.

A batch runs in two halves. :meth:`ModelWorker._launch` (the worker thread, with overlap on)
runs the forward and the sampler and starts the copy of the sampled ids to the host, and is
done: the thread takes the next batch while the device still works. :meth:`ModelWorker._finish`
(the scheduler thread, when it asks for the result) waits for that copy and turns the tensors
into a :class:`BatchResult`. So the per-row host work of batch N never stands between the end
of forward N and the start of forward N+1 (``benchmarks/scheduler_idle.py`` measures the gap).

Where the device runs asynchronously (CUDA), the launch itself returns before the step is done,
so overlap needs no thread: with ``launch="stream"`` (``--overlap-launch stream``) the
scheduler thread launches batch N on the device's stream and goes on, as SGLang's overlap loop
does, with no hand-off between threads and no contention for the GIL. On the CPU a forward is
computed where it is called, so there only the worker thread (``"thread"``, the default)
overlaps anything.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch

from radixserve.config import OVERLAP_LAUNCHES
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.sampler import Sampler, SamplerOutput
from radixserve.runtime.sampling_batch_info import DecodeInfoCache, SamplingBatchInfo
from radixserve.runtime.schedule_batch import ScheduleBatch
from radixserve.runtime.spec_verify import VerifyResult, accept_drafts, verify_sampling_info
from radixserve.transfer import to_device
from radixserve.types import Req


@dataclass(slots=True)
class BatchResult:
    """Per request of the batch (``None`` where it did not sample)."""

    next_token_ids: list[int | None]
    logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # prompt-token logprobs computed in this forward, per request (None: none asked)
    input_logprobs: list[list[float] | None] = field(default_factory=list)
    # beside them, each position's top ``top_logprobs_num`` (token id, logprob), when asked
    input_top_logprobs: list[list[list[tuple[int, float]]] | None] = field(default_factory=list)
    # a verify's (runtime/spec_verify.py): per request every token it keeps (its accepted
    # drafts, then next_token_ids[i]) and how many drafts those are; empty for other batches
    verified: VerifyResult | None = None

    def num_tokens(self, i: int) -> int:
        """Tokens row ``i`` appends (more than one after a verify that accepted drafts)."""
        return 1 if self.verified is None else len(self.verified.tokens[i])

    def append_token(self, req: Req, i: int, j: int = 0) -> None:
        """Append token ``j`` of row ``i`` (see :meth:`num_tokens`) with its logprobs."""
        v = self.verified
        token = self.next_token_ids[i] if v is None else v.tokens[i][j]
        assert token is not None
        req.append_output(token)
        if not req.return_logprob:
            return
        if v is not None and v.logprobs[i]:
            req.output_logprobs.append(v.logprobs[i][j])
            if req.top_logprobs_num:
                req.output_top_logprobs.append(v.top_logprobs[i][j])
        elif v is None and self.logprobs:
            req.output_logprobs.append(self.logprobs[i])  # type: ignore[arg-type]
            if req.top_logprobs_num and self.top_logprobs:
                req.output_top_logprobs.append(self.top_logprobs[i])

    def collect_input_logprobs(self, req: Req, i: int) -> None:
        if self.input_logprobs and self.input_logprobs[i]:
            req.input_logprobs.extend(self.input_logprobs[i])  # type: ignore[arg-type]
        if self.input_top_logprobs and self.input_top_logprobs[i]:
            req.input_top_logprobs.extend(self.input_top_logprobs[i])  # type: ignore[arg-type]


class Worker(Protocol):
    """What the scheduler drives: a model that runs a batch (``ModelWorker``, or a fake one in
    model-free tests). ``submit`` is only called when ``overlap`` is on."""

    overlap: bool

    @property
    def device(self) -> torch.device: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def run(self, batch: ScheduleBatch) -> BatchResult: ...

    def submit(self, batch: ScheduleBatch) -> Future[BatchResult]: ...

    def check_alive(self) -> None:
        """``RuntimeError`` if the model cannot run any more (a tensor-parallel rank died)."""
        ...

    def update_weights_from_disk(self, model_path: str) -> None:
        """The model's weights from another checkpoint of its shape, with nothing in flight;
        ``ValueError`` (the weights unchanged) where it cannot."""
        ...

    def weight_by_name(self, hf_name: str) -> torch.Tensor:
        """A checkpoint tensor as the model holds it now; ``ValueError`` for an unknown name."""
        ...

    def shutdown(self) -> None: ...


class ModelWorker:
    def __init__(
        self, runner: ModelRunner, max_rows: int, overlap: bool, launch: str = "thread"
    ) -> None:
        self.runner = runner
        self.sampler = Sampler(seed=runner.config.random_seed, device=runner.device)
        self.overlap = overlap
        self.last_token = torch.zeros(max_rows, dtype=torch.int64, device=runner.device)
        self._decode_infos = DecodeInfoCache()  # built on the scheduler's thread alone
        assert launch in OVERLAP_LAUNCHES, launch
        threaded = overlap and launch == "thread"
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixserve-forward")
            if threaded
            else None
        )

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self.runner.model_config.eos_token_ids)

    def submit(self, batch: ScheduleBatch) -> Future[BatchResult]:
        """Queue ``batch`` behind the one running (in the worker thread, or on the device's
        stream from this thread); the scheduler goes on meanwhile."""
        assert self.overlap
        info = self._sampling_info(batch)  # built now: it reads request state on this thread
        if self._executor is not None:
            launched = self._executor.submit(self._launch, batch, info)
        else:  # launched here: the device computes it while this thread goes on
            launched = Future()
            try:
                launched.set_result(self._launch(batch, info))
            except Exception as exc:  # raised from result(), as the thread's would be
                launched.set_exception(exc)
        return _Finishing(launched, lambda raw: self._finish(batch, raw))

    def run(self, batch: ScheduleBatch) -> BatchResult:
        return self._finish(batch, self._launch(batch, self._sampling_info(batch)))

    def check_alive(self) -> None:
        self.runner.check_alive()

    def update_weights_from_disk(self, model_path: str) -> None:
        self.runner.update_weights_from_disk(model_path)

    def weight_by_name(self, hf_name: str) -> torch.Tensor:
        return self.runner.weight_by_name(hf_name)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.runner.shutdown()

    # ---- internals -------------------------------------------------------------------------
    def _sampling_info(self, batch: ScheduleBatch) -> SamplingBatchInfo | None:
        rows = [i for i, s in enumerate(batch.samples) if s]
        if not rows:
            return None
        if batch.is_verify:
            return verify_sampling_info(batch, self.runner.vocab_size, self.runner.device)
        reqs = [batch.reqs[i] for i in rows]

        def build() -> SamplingBatchInfo:
            return SamplingBatchInfo.from_reqs(reqs, self.runner.vocab_size, self.runner.device)

        info = self._decode_infos.get(reqs, build) if batch.is_decode else build()
        # the draw index of a seeded stream: output tokens before this one (in flight included)
        info.steps = [r.kv_len - r.prompt_len if batch.is_decode else r.output_len for r in reqs]
        return info

    def _launch(self, batch: ScheduleBatch, info: SamplingBatchInfo | None) -> _Launched:
        fb = batch.forward_batch
        assert fb is not None
        if fb.is_decode:
            fb.input_ids = self.last_token.index_select(0, fb.req_pool_indices)
        out = self.runner.forward(fb)
        n = len(batch.reqs)
        result = BatchResult([None] * n, [None] * n, [[] for _ in range(n)], [None] * n, [None] * n)
        if out.input_token_logprobs is not None:
            for i, lp in enumerate(out.input_token_logprobs):
                if lp is not None:
                    result.input_logprobs[i] = lp.tolist()
        for i, top in enumerate(out.input_top_logprobs or []):
            if top is not None:
                values, ids = top[0].tolist(), top[1].tolist()
                result.input_top_logprobs[i] = [
                    list(zip(t, v, strict=True)) for t, v in zip(ids, values, strict=True)
                ]
        self._boundary_logprobs(batch, out.next_token_logits, result)
        if info is None:
            return _Launched(result, [], None)
        if batch.is_verify:
            return self._verified(batch, out.next_token_logits, info, result)
        rows = [i for i, s in enumerate(batch.samples) if s]
        logits = out.next_token_logits if len(rows) == n else out.next_token_logits[rows]
        sampled = self.sampler(logits, info)
        row_idx = to_device([_row(batch.reqs[i]) for i in rows], self.last_token.device)
        self.last_token.index_copy_(0, row_idx, sampled.next_token_ids)
        return _Launched(result, rows, _HostCopy.start(sampled), info.top_logprobs_nums)

    def _verified(
        self,
        batch: ScheduleBatch,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        result: BatchResult,
    ) -> _Launched:
        """A verify's tokens, on the host now (a verify is never overlapped with the next
        step: which tokens it keeps decides that step's input)."""
        verified = accept_drafts(self.sampler, logits, batch, info)
        result.verified = verified
        result.next_token_ids = [ts[-1] for ts in verified.tokens]
        last = to_device([ts[-1] for ts in verified.tokens], self.last_token.device)
        row_idx = to_device([_row(r) for r in batch.reqs], self.last_token.device)
        self.last_token.index_copy_(0, row_idx, last)
        return _Launched(result, [], None)

    @staticmethod
    def _finish(batch: ScheduleBatch, launched: _Launched) -> BatchResult:
        result, rows = launched.result, launched.rows
        if launched.sampled is None:
            return result
        sampled = launched.sampled.wait()
        for i, token in zip(rows, sampled.next_token_ids.tolist(), strict=True):
            result.next_token_ids[i] = token
        if sampled.next_token_logprobs is not None:
            for i, lp in zip(rows, sampled.next_token_logprobs.tolist(), strict=True):
                result.logprobs[i] = lp
        if sampled.top_logprobs is not None and sampled.top_logprob_ids is not None:
            values, ids = sampled.top_logprobs.tolist(), sampled.top_logprob_ids.tolist()
            for j, i in enumerate(rows):
                k = launched.top_logprobs_nums[j]
                result.top_logprobs[i] = list(zip(ids[j][:k], values[j][:k], strict=True))
        return result

    @staticmethod
    def _boundary_logprobs(batch: ScheduleBatch, logits: torch.Tensor, result: BatchResult) -> None:
        """A mid-prompt chunk's last logits predict the next chunk's first token: keep that
        prompt logprob too, so chunking never leaves a hole in ``input_logprobs``."""
        for i, target in enumerate(batch.boundary_targets):
            if target is None:
                continue
            logprobs = torch.log_softmax(logits[i], dim=-1)
            result.input_logprobs[i] = (result.input_logprobs[i] or []) + [float(logprobs[target])]
            k = batch.reqs[i].top_logprobs_num if batch.reqs[i].return_logprob else 0
            if k:
                top = logprobs.topk(min(k, logprobs.shape[-1]))
                pairs = list(zip(top.indices.tolist(), top.values.tolist(), strict=True))
                result.input_top_logprobs[i] = (result.input_top_logprobs[i] or []) + [pairs]


def _row(req: Req) -> int:
    assert req.req_pool_idx is not None, "a request in a batch holds a row"
    return req.req_pool_idx


@dataclass(slots=True)
class _HostCopy:
    """The sampler's tensors on their way to the host: on CUDA a non-blocking copy into pinned
    memory and an event after it; on the CPU the tensors themselves."""

    sampled: SamplerOutput
    ready: torch.cuda.Event | None

    @classmethod
    def start(cls, sampled: SamplerOutput) -> _HostCopy:
        if sampled.next_token_ids.device.type != "cuda":
            return cls(sampled, None)
        copies = [
            None if t is None else t.to("cpu", non_blocking=True)
            for t in (
                sampled.next_token_ids,
                sampled.next_token_logprobs,
                sampled.top_logprobs,
                sampled.top_logprob_ids,
            )
        ]
        ready = torch.cuda.Event()
        ready.record()
        return cls(SamplerOutput(*copies), ready)  # type: ignore[arg-type]

    def wait(self) -> SamplerOutput:
        if self.ready is not None:
            self.ready.synchronize()
        return self.sampled


@dataclass(slots=True)
class _Launched:
    """A batch whose forward and sampling are launched: what :meth:`ModelWorker._finish` needs."""

    result: BatchResult  # prompt logprobs already in
    rows: list[int]  # the batch rows that sampled, in the sampler's order
    sampled: _HostCopy | None
    top_logprobs_nums: list[int] = field(default_factory=list)


class _Finishing(Future[BatchResult]):
    """The scheduler's handle on a submitted batch: ``result()`` waits for the worker thread's
    launch, then finishes the batch on the calling (scheduler) thread, once."""

    def __init__(self, launched: Future[_Launched], finish: Callable[[_Launched], BatchResult]):
        super().__init__()
        self._launched = launched
        self._finish = finish

    def result(self, timeout: float | None = None) -> BatchResult:
        if not self.done():
            launched = self._launched.result(timeout)  # the worker thread's error, as raised
            try:
                self.set_result(self._finish(launched))
            except BaseException as exc:
                self.set_exception(exc)
        return super().result(timeout)
