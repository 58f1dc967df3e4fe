"""What the executor needs from a backend, and the process-wide default backend.

A backend is called from many threads at once (one per program state), so implementations
must be thread-safe. Every call either returns or raises (:class:`BackendError` for transport
failures): a backend never leaves a program waiting forever.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixserve.frontend.chat_template import ChatTemplate
from radixserve.frontend.select_methods import ChoiceLogprobs


@dataclass(frozen=True, slots=True)
class GenChunk:
    """A piece of generated text; the last chunk of a stream has ``meta_info`` with a
    ``finish_reason``. A non-streamed ``generate`` returns one chunk holding all the text."""

    text: str
    meta_info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, result: dict[str, Any]) -> GenChunk:
        """From a ``/generate`` result (the Engine returns the same dicts)."""
        return cls(result["text"], result.get("meta_info", {}))


class Backend(Protocol):
    """The operations a program runs; ``prompt`` is always the state's full text so far (the
    backend tokenizes it, and the radix cache finds the prefix computed before)."""

    @property
    def chat_template(self) -> ChatTemplate: ...

    def generate(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> GenChunk:
        """``lora``: the LoRA adapter's name (``None``: the base model)."""
        ...

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> Iterator[GenChunk]:
        """Text deltas as they are produced."""
        ...

    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        """Prefill ``prompt`` without generating, so later calls sharing it hit the cache;
        returns the request's ``meta_info``."""
        ...

    def score_choices(self, prefix: str, choices: list[str]) -> list[ChoiceLogprobs]:
        """The log-probability of each choice's tokens after ``prefix``: one prefill per
        choice on top of the (cached) prefix, never generation."""
        ...

    def get_stats(self) -> dict[str, Any]:
        """The scheduler's counters (``num_cached_prompt_tokens``, ``num_prefill_tokens``...)."""
        ...

    def flush_cache(self) -> bool: ...

    def shutdown(self) -> None: ...


class _DefaultBackend:
    """The backend that ``run`` uses when none is passed (SGLang's ``set_default_backend``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backend: Backend | None = None

    def set(self, backend: Backend | None) -> None:
        with self._lock:
            self._backend = backend

    def get(self) -> Backend:
        with self._lock:
            if self._backend is None:
                raise ValueError(
                    "no backend: pass backend=... to run() or call set_default_backend(...)"
                )
            return self._backend


_DEFAULT = _DefaultBackend()


def set_default_backend(backend: Backend | None) -> None:
    """Make ``backend`` the one programs run on when ``run`` gets none (``None`` clears it)."""
    _DEFAULT.set(backend)


def get_default_backend() -> Backend:
    return _DEFAULT.get()
