"""Runtime: the in-process backend, an :class:`radixserve.Engine` in this process.

The engine (and with it torch) is imported only when a ``Runtime`` is made, so importing the
frontend stays free of the runtime. The engine is thread-safe: program states call it from
their own threads and its scheduler batches those requests together.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixserve.frontend.backends.base import GenChunk
from radixserve.frontend.backends.scoring import (
    PromptInputs,
    prompt_logprob_rows,
    score_choices,
)
from radixserve.frontend.chat_template import ChatTemplate
from radixserve.frontend.select_methods import ChoiceLogprobs

_PREFILL_ONLY = {"max_new_tokens": 0}


class Runtime:
    """``Runtime(model_path, **engine_kwargs)`` starts an Engine (any ``EngineConfig`` field as
    a keyword); ``Runtime(engine=engine)`` wraps one that the caller keeps (and shuts down itself)."""

    def __init__(
        self, model_path: str | None = None, *, engine: Any | None = None, **engine_kwargs: Any
    ) -> None:
        if engine is None:
            import radixserve  # the package's lazy ``Engine`` attribute loads the runtime

            engine = radixserve.Engine(model_path, **engine_kwargs)
            self._owns_engine = True
        elif model_path is not None or engine_kwargs:
            raise ValueError("give either an engine or a model path with engine keywords")
        else:
            self._owns_engine = False
        self.engine = engine
        self._chat_template = ChatTemplate.from_tokenizer(engine.tokenizer)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def tokenizer(self) -> Any | None:
        return self.engine.tokenizer

    def generate(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> GenChunk:
        out = self.engine.generate(prompt, sampling_params, lora_path=lora)
        return GenChunk.of(out)

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], lora: str | None = None
    ) -> Iterator[GenChunk]:
        for out in self.engine.generate(prompt, sampling_params, stream=True, lora_path=lora):
            yield GenChunk.of(out)

    def cache_prefix(self, prompt: str) -> dict[str, Any]:
        return dict(self.engine.generate(prompt, _PREFILL_ONLY)["meta_info"])

    def prompt_logprobs(
        self, inputs: PromptInputs, start: int
    ) -> list[tuple[list[float], list[int], dict[str, Any]]]:
        by_ids = bool(inputs) and isinstance(inputs[0], list)
        outs = self.engine.generate(
            prompt=None if by_ids else list(inputs),
            input_ids=list(inputs) if by_ids else None,
            sampling_params=_PREFILL_ONLY,
            return_logprob=True,
            logprob_start_len=start,
        )
        return prompt_logprob_rows(inputs, outs, start)

    def score_choices(self, prefix: str, choices: list[str]) -> list[ChoiceLogprobs]:
        return score_choices(self, prefix, choices)

    def get_stats(self) -> dict[str, Any]:
        return dict(self.engine.get_stats())

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
