"""Engine: the scheduler in-process, driven by a background thread, for offline batches, tests
and the frontend's in-process backend.

Only the loop thread touches the scheduler; callers talk to it through an inbox of calls and
per-request output queues, so ``generate`` may be called from many threads at once.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from radixserve.config import EngineConfig
from radixserve.hub import resolve_model
from radixserve.runtime.io_struct import GenerateRequest, ReqOutput
from radixserve.runtime.pause import Pause
from radixserve.runtime.scheduler import Scheduler
from radixserve.runtime.stop_strings import decode
from radixserve.runtime.weight_update import (
    check_load_format,
    update_weights_from_disk,
    updated,
    weights_by_name,
)
from radixserve.server.detokenizer import Detokenizer
from radixserve.server.io_struct import DetokenizeParams, SchedulerInfo, TextOutput
from radixserve.server.request_validation import RequestValidator
from radixserve.server.result import RequestResult, TokenText, generate_result
from radixserve.tokenizer_loader import load_tokenizer
from radixserve.types import SamplingParams, new_rid

_Call = tuple[Callable[[], Any], Future[Any]]


class Engine:
    """``Engine(model_path, **config)``: any :class:`EngineConfig` field by its flat name
    (``max_running_requests=8``, ``tp_size=2``: :meth:`EngineConfig.from_flat`);
    ``model_path`` a checkpoint directory or a hub id (``ORG/NAME``, ``revision``: its
    branch, tag or commit), resolved through huggingface_hub's cache."""

    def __init__(
        self,
        model_path: str | None = None,
        tokenizer: Any | None = None,
        *,
        revision: str | None = None,
        **config: Any,
    ) -> None:
        if model_path is not None:
            model_path = resolve_model(str(model_path), revision)
        self.config = EngineConfig.from_flat(model_path=model_path, **config)
        if tokenizer is None and model_path is not None:
            tokenizer = load_tokenizer(model_path)
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(self.config, tokenizer=tokenizer)
        text_tokens = len(tokenizer) if tokenizer is not None else None
        self.validator = RequestValidator(SchedulerInfo.of(self.scheduler), 128, text_tokens)
        self._inbox: queue.Queue[_Call | None] = queue.Queue()  # None: stop the loop
        self._outputs: dict[str, queue.Queue[ReqOutput | BaseException]] = {}
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._pause = Pause()  # touched by the loop thread only, as the scheduler is
        self.weight_version = "default"  # SGLang's label of the served weights (meta_info)
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
        return_text_in_logprobs: bool = False,
        priority: int | list[int] = 0,
        rid: str | list[str] | None = None,
        extra_key: str | None = None,
        stream: bool = False,
        lora_path: str | list[str | None] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one prompt (a dict) or a batch (a list of dicts, in order), in the
        shape of ``/generate`` (``server/result.py``); ``stream`` (single prompt only) yields
        dicts whose ``text`` and ``output_ids`` are the new part since the last one.
        ``lora_path``: the name of a loaded LoRA adapter (SGLang's field), or one per prompt."""
        started = time.monotonic()
        batch = isinstance(prompt, list) or (
            input_ids is not None and len(input_ids) > 0 and isinstance(input_ids[0], list)
        )
        ids_list = self._tokenize(prompt, input_ids)
        n = len(ids_list)
        raw_params = _per_item(sampling_params, n)
        prios = priority if isinstance(priority, list) else [priority] * n
        loras = lora_path if isinstance(lora_path, list) else [lora_path] * n
        rids = (
            rid
            if isinstance(rid, list)
            else ([rid] if rid is not None else [new_rid() for _ in range(n)])
        )
        if len(raw_params) != n or len(prios) != n or len(rids) != n or len(loras) != n:
            raise ValueError(
                "per-item sampling_params, priority, rid and lora_path must match the number "
                "of prompts"
            )
        if stream and batch:
            raise ValueError("stream=True takes a single prompt")
        params = [
            self._sampling_params(p, len(ids)) for p, ids in zip(raw_params, ids_list, strict=True)
        ]
        requests = [
            self.validator.check(
                GenerateRequest(
                    r,
                    ids,
                    p,
                    pr,
                    extra_key,
                    return_logprob,
                    top_logprobs_num,
                    logprob_start_len,
                    lora_name=lora,
                )
            )
            for r, ids, p, pr, lora in zip(rids, ids_list, params, prios, loras, strict=True)
        ]
        self.validator.check_group(len(requests))
        self._submit(requests)
        with_text = return_text_in_logprobs and self.tokenizer is not None
        token_text = self._token_text if with_text else None
        if stream:
            return self._stream(requests[0], started, token_text)
        results = [self._collect(r, started, token_text) for r in requests]
        return results if batch else results[0]

    def abort(self, rid: str) -> None:
        self._call(lambda: self.scheduler.abort_request(rid))

    def load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False) -> None:
        """Serve the PEFT adapter at ``lora_path`` as ``lora_name`` (``pinned``: never dropped
        from memory); ``ValueError`` if it cannot (see ``runtime/lora_manager.py``)."""
        self._call(lambda: self.scheduler.loras.load(lora_name, lora_path, pinned))

    def unload_lora_adapter(self, lora_name: str) -> None:
        """Stop serving ``lora_name``; its requests in flight finish under it."""
        self._call(lambda: self.scheduler.loras.unload(lora_name))

    def lora_adapters(self) -> dict[str, str]:
        """name -> directory of every adapter served."""
        return dict(self._call(self.scheduler.loras.adapters))

    def flush_cache(self) -> bool:
        return bool(self._call(self.scheduler.flush_cache))

    def pause_generation(self, mode: str = "abort") -> None:
        """SGLang's ``pause_generation``: no step runs until :meth:`continue_generation`;
        ``mode`` ``abort`` (every request ends, aborted), ``in_place`` (they wait, KV kept) or
        ``retract`` (back to the queue, their KV cached): ``runtime/pause.py``. ``ValueError``
        for another mode."""
        self._call(lambda: self._deliver(self._pause.pause(self.scheduler, mode)))

    def update_weights_from_disk(
        self,
        model_path: str,
        load_format: str | None = None,
        *,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        weight_version: str | None = None,
    ) -> tuple[bool, str, int]:
        """SGLang's ``update_weights_from_disk``: the weights of ``model_path`` (a checkpoint of
        this model's shape: a directory or a hub id) in place of the served ones, the prefix
        cache emptied (``runtime/weight_update.py``). Returns SGLang's ``(success, message,
        num_paused_requests)``: a refusal (requests running, another shape, unreadable files)
        is ``success`` False with the reason, the served weights unchanged. ``weight_version``
        labels the new weights in each result's ``meta_info``."""
        try:
            check_load_format(load_format)
            path = resolve_model(str(model_path))
            self._call(
                lambda: update_weights_from_disk(
                    self.scheduler, path, self._deliver, flush_cache, abort_all_requests
                )
            )
        except ValueError as exc:
            return False, str(exc), 0
        if weight_version is not None:
            self.weight_version = weight_version
        return True, updated(weight_version), 0

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list[Any]:
        """SGLang's ``get_weights_by_name``: the first ``truncate_size`` rows of the checkpoint
        tensor ``name`` (transformers' name) as the model holds it now, as lists of floats;
        ``ValueError`` for a name the model does not hold."""
        return list(self._call(lambda: weights_by_name(self.scheduler, name, truncate_size)))

    def continue_generation(self) -> None:
        self._call(self._pause.resume)

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

    def _sampling_params(
        self, params: dict[str, Any] | SamplingParams | None, prompt_len: int
    ) -> SamplingParams:
        """A copy of ``params`` for one prompt; without ``max_new_tokens``, the default clipped
        to the context left (as ``/generate`` does)."""
        if isinstance(params, SamplingParams):
            out = dataclasses.replace(params)  # validate() may normalise it: not the caller's
        else:
            fields = dict(params or {})
            if fields.get("max_new_tokens") is None:
                fields["max_new_tokens"] = self.validator.max_new_tokens_for(prompt_len, None)
            try:
                out = SamplingParams(**fields)
            except TypeError as exc:
                raise ValueError(f"unknown sampling parameter: {exc}") from None
        if out.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: this engine has none")
        return out

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

    def _collect(
        self, request: GenerateRequest, started: float, token_text: TokenText | None
    ) -> dict[str, Any]:
        result, detokenize = RequestResult(request), self._detokenizer(request)
        while result.finish_reason is None:
            result.add(detokenize(self._next_output(request.rid)))
        self._outputs.pop(request.rid, None)
        return generate_result(result, started, token_text, weight_version=self.weight_version)

    def _stream(
        self, request: GenerateRequest, started: float, token_text: TokenText | None
    ) -> Iterator[dict[str, Any]]:
        result, detokenize = RequestResult(request), self._detokenizer(request)
        try:
            while result.finish_reason is None:
                out = detokenize(self._next_output(request.rid))
                result.add(out)
                yield generate_result(
                    result, started, token_text, delta=out, weight_version=self.weight_version
                )
        finally:
            self._outputs.pop(request.rid, None)
            if result.finish_reason is None:  # the consumer stopped early
                self.abort(request.rid)

    def _detokenizer(self, request: GenerateRequest) -> Callable[[ReqOutput], TextOutput]:
        """The request's text, as the server's detokenizer process would make it."""
        if self.tokenizer is None:
            return lambda out: TextOutput(out, "")
        detokenizer = Detokenizer(self.tokenizer)
        detokenizer.register(DetokenizeParams.of(request))
        return detokenizer.process

    def _token_text(self, token_id: int) -> str:
        return decode(self.tokenizer, [token_id], skip_special_tokens=False)

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._error is not None:
            raise RuntimeError("the engine loop has died") from self._error
        future: Future[Any] = Future()
        self._inbox.put((fn, future))
        return future.result()

    # ---- loop thread ------------------------------------------------------------------------
    def _deliver(self, outputs: list[ReqOutput]) -> None:
        for out in outputs:
            with self._lock:
                q = self._outputs.get(out.rid)
            if q is not None:
                q.put(out)

    def _loop(self) -> None:
        try:
            while True:
                block = not self._pause.may_step(self.scheduler)
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
                if self._pause.may_step(self.scheduler):
                    self._deliver(self.scheduler.step())
        except BaseException as exc:
            self._error = exc
            with self._lock:
                for q in self._outputs.values():
                    q.put(exc)
            raise


def _per_item(params: dict[str, Any] | SamplingParams | list[Any] | None, n: int) -> list[Any]:
    return list(params) if isinstance(params, list) else [params] * n
