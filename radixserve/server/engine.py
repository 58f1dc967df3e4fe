"""Engine: the scheduler in-process, driven by a background thread, for offline batches, tests
and the frontend's in-process backend.

Only the loop thread touches the scheduler; callers talk to it through an inbox of calls and
per-request output queues, so ``generate`` may be called from many threads at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from radixserve.config import EngineConfig
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.runtime.scheduler import Scheduler
from radixserve.server.text import IncrementalText, output_dict
from radixserve.types import SamplingParams, new_rid

_Call = tuple[Callable[[], Any], Future[Any]]


class Engine:
    """``Engine(model_path, **config)``: any :class:`EngineConfig` field as a keyword."""

    def __init__(
        self, model_path: str | None = None, tokenizer: Any | None = None, **config: Any
    ) -> None:
        self.config = EngineConfig(model_path=model_path, **config)
        if tokenizer is None and model_path is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(self.config, tokenizer=tokenizer)
        self._inbox: queue.Queue[_Call | None] = queue.Queue()  # None: stop the loop
        self._outputs: dict[str, queue.Queue[ReqOutput | BaseException]] = {}
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="radixserve-engine", daemon=True)
        self._thread.start()

    # ---- public API -------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | SamplingParams | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        priority: int | list[int] = 0,
        rid: str | list[str] | None = None,
        extra_key: str | None = None,
        stream: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one prompt (a dict) or a batch (a list of dicts, in order); ``stream``
        (single prompt only) yields dicts whose ``text`` is the new text since the last one."""
        batch = isinstance(prompt, list) or (
            input_ids is not None and len(input_ids) > 0 and isinstance(input_ids[0], list)
        )
        ids_list = self._tokenize(prompt, input_ids)
        n = len(ids_list)
        params = _per_item(sampling_params, n)
        prios = priority if isinstance(priority, list) else [priority] * n
        rids = (
            rid
            if isinstance(rid, list)
            else ([rid] if rid is not None else [new_rid() for _ in range(n)])
        )
        if len(params) != n or len(prios) != n or len(rids) != n:
            raise ValueError(
                "per-item sampling_params, priority and rid must match the number of prompts"
            )
        if stream and batch:
            raise ValueError("stream=True takes a single prompt")
        requests = [
            GenerateRequest(
                r, ids, p, pr, extra_key, return_logprob, top_logprobs_num, logprob_start_len
            )
            for r, ids, p, pr in zip(rids, ids_list, params, prios, strict=True)
        ]
        self._submit(requests)
        if stream:
            return self._stream(requests[0])
        results = [self._collect(r) for r in requests]
        return results if batch else results[0]

    def abort(self, rid: str) -> None:
        self._call(lambda: self.scheduler.abort_request(rid))

    def flush_cache(self) -> bool:
        return bool(self._call(self.scheduler.flush_cache))

    def get_stats(self) -> dict[str, Any]:
        return dict(self._call(self.scheduler.get_stats))

    def check_integrity(self) -> None:
        self._call(self.scheduler.check_integrity)

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join()
        self.scheduler.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- caller side ------------------------------------------------------------------------
    def _tokenize(self, prompt: str | list[str] | None, input_ids: Any) -> list[list[int]]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt and input_ids")
        if input_ids is not None:
            items = input_ids if input_ids and isinstance(input_ids[0], list) else [input_ids]
            return [list(map(int, ids)) for ids in items]
        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer: pass input_ids")
        texts = prompt if isinstance(prompt, list) else [prompt]
        return [self.tokenizer.encode(t) for t in texts]

    def _submit(self, requests: list[GenerateRequest]) -> None:
        """Queue the whole batch in one loop turn (so it is scheduled together), all or nothing:
        if one request is invalid, those already queued are aborted and the error raised."""
        with self._lock:
            for request in requests:
                self._outputs[request.rid] = queue.Queue()

        def add_all() -> None:
            added: list[str] = []
            try:
                for request in requests:
                    self.scheduler.add_request(request)
                    added.append(request.rid)
            except BaseException:
                for rid in added:
                    self.scheduler.abort_request(rid)
                raise

        try:
            self._call(add_all)
        except BaseException:
            with self._lock:
                for request in requests:
                    self._outputs.pop(request.rid, None)
            raise

    def _next_output(self, rid: str) -> ReqOutput:
        item = self._outputs[rid].get()
        if isinstance(item, BaseException):
            raise RuntimeError(f"the engine failed while running {rid}") from item
        return item

    def _collect(self, request: GenerateRequest) -> dict[str, Any]:
        text = IncrementalText(self.tokenizer, request)
        done = False
        while not done:
            out = self._next_output(request.rid)
            _, done = self._absorb(text, out, request.rid)
        return output_dict(text, out)

    def _stream(self, request: GenerateRequest) -> Iterator[dict[str, Any]]:
        text = IncrementalText(self.tokenizer, request)
        done = False
        try:
            while not done:
                out = self._next_output(request.rid)
                delta, done = self._absorb(text, out, request.rid)
                yield output_dict(text, out, delta=delta)
        finally:
            if not done:  # the consumer stopped early
                self._outputs.pop(request.rid, None)
                self.abort(request.rid)

    def _absorb(self, text: IncrementalText, out: ReqOutput, rid: str) -> tuple[str, bool]:
        """Feed one output: (the new text, whether the request is done)."""
        delta = text.add(out)
        if text.stopped_early:  # a stop string the scheduler has not acted on: stop it there
            self.abort(rid)
        done = text.finish_reason is not None
        if done:
            self._outputs.pop(rid, None)
        return delta, done

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._error is not None:
            raise RuntimeError("the engine loop has died") from self._error
        future: Future[Any] = Future()
        self._inbox.put((fn, future))
        return future.result()

    # ---- loop thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                block = not self.scheduler.has_work
                while True:
                    try:
                        item = self._inbox.get(block=block)
                    except queue.Empty:
                        break
                    if item is None:
                        return
                    fn, future = item
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # delivered to the caller
                        future.set_exception(exc)
                    block = False
                for out in self.scheduler.step():
                    with self._lock:
                        q = self._outputs.get(out.rid)
                    if q is not None:
                        q.put(out)
        except BaseException as exc:
            self._error = exc
            with self._lock:
                for q in self._outputs.values():
                    q.put(exc)
            raise


def _per_item(
    params: dict[str, Any] | SamplingParams | list[Any] | None, n: int
) -> list[SamplingParams]:
    def one(p: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        if p is None:
            return SamplingParams()
        if isinstance(p, SamplingParams):
            return p
        try:
            return SamplingParams(**p)
        except TypeError as exc:
            raise ValueError(f"unknown sampling parameter: {exc}") from None

    if isinstance(params, list):
        return [one(p) for p in params]
    return [one(params) for _ in range(n)]
