"""``run_batch``: many runs of one program on a thread pool, with the shared prefix warmed first.

Programs of one batch usually share a prefix (a long system prompt, few-shot examples). If all
of them send their first request at once, a scheduler that admits them in one prefill pass
(FCFS, the default) computes that prefix once per request: nothing is in the radix cache yet.
So, like SGLang's "precache with tracing", the first run goes ahead alone until its first
backend call, which is preceded by a prefill-only request of its text; the other runs start
once that prefill is done, and find the shared part of their prompts in the cache. The cost is
one prefill-only request of latency; programs that share nothing lose nothing else (the first
run's own request then hits its prefilled text).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixserve.frontend.backends.base import Backend, GenChunk
from radixserve.frontend.chat_template import ChatTemplate
from radixserve.frontend.errors import ProgramError
from radixserve.frontend.select_methods import ChoiceLogprobs

MAX_AUTO_THREADS = 64


class PrefixWarmup:
    """A backend wrapper for the batch's first run: before its first request, prefill that
    request's prompt, then set ``done`` (also set by ``release`` if the run never calls)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.done = threading.Event()

    @property
    def chat_template(self) -> ChatTemplate:
        return self.backend.chat_template

    def release(self) -> None:
        self.done.set()

    def _warm(self, prompt: str) -> None:
        if self.done.is_set():
            return
        try:
            if prompt:
                self.backend.cache_prefix(prompt)
        finally:
            self.done.set()

    def generate(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> GenChunk:
        self._warm(prompt)
        return self.backend.generate(prompt, sampling_params, lora)

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> Iterator[GenChunk]:
        self._warm(prompt)
        return self.backend.generate_stream(prompt, sampling_params, lora)

    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        self.done.set()
        return self.backend.cache_prefix(prompt)

    def score_choices(self, prefix: str, choices: list[str]) -> list[ChoiceLogprobs]:
        self._warm(prefix)
        return self.backend.score_choices(prefix, choices)

    def get_stats(self) -> dict[str, Any]:
        return self.backend.get_stats()

    def flush_cache(self) -> bool:
        return self.backend.flush_cache()

    def shutdown(self) -> None:
        self.backend.shutdown()


def run_batch(
    run_one: Callable[[Backend, dict[str, Any]], Any],
    backend: Backend,
    batch_kwargs: Sequence[dict[str, Any]],
    num_threads: int | str,
    warmup: bool,
) -> list[Any]:
    """``run_one(backend, kwargs)`` for every item on a pool; results in order. Raises the
    first failure (by position) after every run has finished."""
    if not batch_kwargs:
        return []
    if num_threads == "auto":
        num_threads = min(len(batch_kwargs), MAX_AUTO_THREADS)
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
    gate = PrefixWarmup(backend) if warmup and len(batch_kwargs) > 1 else None

    def first(kwargs: dict[str, Any]) -> Any:
        assert gate is not None
        try:
            return run_one(gate, kwargs)  # type: ignore[arg-type]
        finally:
            gate.release()

    def rest(kwargs: dict[str, Any]) -> Any:
        if gate is not None:
            gate.done.wait()
        return run_one(backend, kwargs)

    with ThreadPoolExecutor(num_threads, thread_name_prefix="radixserve-batch") as pool:
        futures = [
            pool.submit(first if i == 0 and gate is not None else rest, dict(kw))
            for i, kw in enumerate(batch_kwargs)
        ]
        errors = [f.exception() for f in futures]
    for i, exc in enumerate(errors):
        if exc is not None:
            where = exc.location if isinstance(exc, ProgramError) else None
            raise ProgramError(f"run_batch item {i}", where, exc) from exc
    return [f.result() for f in futures]
